"""The FSDP2 recipe on Qwen3.5 (hybrid Gated DeltaNet + full attention), on CPU with the tiny stand-in: two torchrun
nodes train it with packed chat rows and resume from its distributed checkpoint; the recipe's packing gives every
sample the loss it has alone."""
import json

import pytest
import torch

from test_recipes import DATA, assert_sharded_over_both_nodes, fsdp2_args, load_recipe_module, run_two_nodes

RECIPE = "fsdp2_qwen3_multinode"


def test_qwen3_5_trains_as_two_nodes_and_resumes_from_its_checkpoint(tmp_path, standin):
    model = standin("qwen3.5-27b")
    args = fsdp2_args(model, tmp_path / "out", 12, "--save_steps", 6, "--per_device_train_batch_size", 1)
    first = run_two_nodes(RECIPE, args, tmp_path, timeout=300)
    assert_sharded_over_both_nodes(first)
    assert first["final_loss"] < 0.8 * first["initial_loss"], first["losses"]
    assert "PyTorch fallback" in first["linear_attention_kernels"]  # no GPU here: transformers' kernels, ours on top
    assert first["resumed_from_step"] is None and len(first["checkpoints"]) == 1
    # The same command again: it resumes from the step-6 checkpoint and redoes steps 7..12 on the same data.
    second = run_two_nodes(RECIPE, args, tmp_path, timeout=300)
    assert second["resumed_from_step"] == 6
    assert second["losses"][:6] == first["losses"][:6]
    assert second["losses"][6:] == pytest.approx(first["losses"][6:], abs=2e-3)


def test_the_recipes_packed_rows_give_each_qwen3_5_sample_its_loss_alone(standin):
    """pack() rows through the model as train_step calls it (packed_kwargs, the recipe's kernels) against each
    sample alone: fp32 on CPU, equal to 1e-5 relative (the matmul shapes differ, nothing else)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    train = load_recipe_module(RECIPE, "train")
    path = standin("qwen3.5-27b")
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="sdpa").eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    train.install(train.select_kernels(torch.device("cpu")))
    rows = [json.loads(line) for line in (DATA / "capybara" / "train.jsonl").read_text().splitlines()[:4]]
    template = train.get_training_chat_template(tokenizer)
    samples = [train.tokenize_chat(tokenizer, template, r["messages"], 256) for r in rows]

    def sample_losses(packed_rows):
        ids = torch.tensor([r["input_ids"] for r in packed_rows])
        positions = torch.tensor([r["position_ids"] for r in packed_rows])
        labels = torch.tensor([r["labels"] for r in packed_rows])
        logits = model(input_ids=ids, position_ids=positions, use_cache=False, **train.packed_kwargs(positions)).logits
        token_loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100,
                                                       reduction="none").view(labels.shape)
        sums = []
        for row, pos in zip(token_loss, positions):
            starts = (pos == 0).nonzero().flatten().tolist() + [len(pos)]
            sums += [row[a:b].sum().item() for a, b in zip(starts, starts[1:])]
        return sums

    with torch.no_grad():
        length = max(sum(len(ids) for ids, _ in samples[:2]), sum(len(ids) for ids, _ in samples[2:])) + 3
        packed = train.pack(samples, seq_len=length, pad_id=0)
        assert len(packed) == 2  # two samples and a padding segment per row
        together = sample_losses(packed)
        alone = [sample_losses(train.pack([s], len(s[0]), 0))[0] for s in samples]
    assert [together[0], together[1], together[3], together[4]] == pytest.approx(alone, rel=1e-5)


def test_only_rank_0_reads_the_weights_in_bf16_and_the_final_model_is_saved_from_the_shards(tmp_path):
    """A stand-in wide enough (71 M parameters: 286 MB in fp32, 143 MB on disk in bf16) that a full copy shows in a
    rank's host memory. While loading, rank 1 adds less than 0.7 of the fp32 model (its fp32 shard is 0.5), rank 0 less
    than 1.4 (the bf16 copy it reads, 0.5, and its shard); the old load held the whole model in fp32 on every rank,
    about 2 with the file and the shard. With learning_rate 0 the saved final model is the checkpoint's weights in
    bf16, tensor for tensor: every shard was filled from rank 0 and gathered back."""
    import standins
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    path = standins.make("qwen3-0.6b", out=tmp_path / "wide")
    config = standins.config("qwen3-0.6b", layers=8)
    config.update(dict(hidden_size=768, intermediate_size=3072, num_attention_heads=12, num_key_value_heads=4,
                       head_dim=64))
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).save_pretrained(path)  # as hub checkpoints are
    args = fsdp2_args(path, tmp_path / "out", 1, "--learning_rate", 0, "--warmup_steps", 0, "--max_length", 64,
                      "--per_device_train_batch_size", 1, "--timing_warmup_steps", 0, "--save_steps", 0,
                      "--save_final_model", "true")
    metrics = run_two_nodes(RECIPE, args, tmp_path, timeout=300)
    fp32_bytes = 4 * metrics["parameters"]
    assert metrics["parameters"] > 70e6
    loaded = {r["rank"]: r["host_memory_load_bytes"] / fp32_bytes for r in metrics["ranks"]}
    assert loaded[1] < 0.7 and loaded[0] < 1.4, loaded

    original = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).state_dict()
    saved = load_file(tmp_path / "out" / "final_model" / "model.safetensors")
    assert saved.keys() == original.keys()
    unequal = [name for name in saved if not torch.equal(saved[name], original[name])]
    assert not unequal, unequal
