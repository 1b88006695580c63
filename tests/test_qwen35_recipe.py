"""The FSDP2 recipe on Qwen3.5 (hybrid Gated DeltaNet + full attention), on CPU with the tiny stand-in: two torchrun
nodes train it with packed Alpaca rows and resume from its distributed checkpoint; the recipe's packing gives every
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
    rows = [json.loads(line) for line in (DATA / "alpaca" / "train.jsonl").read_text().splitlines()[:4]]
    samples = [train.tokenize_prompt_response(tokenizer, train.alpaca_prompt(r), r["output"], 256) for r in rows]

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
