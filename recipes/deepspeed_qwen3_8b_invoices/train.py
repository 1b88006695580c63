"""TRL SFT of Qwen3-8B on invoice/receipt -> JSON extraction with DeepSpeed ZeRO-3, one torchrun agent per node.

    torchrun --nnodes=N --nproc-per-node=G --rdzv-backend=c10d --rdzv-endpoint=HOST:29500 --rdzv-id=JOB \
        train.py --config config.yaml [--key value ...]

The data is prompt/completion chat (the user turn holds the document, the assistant turn the JSON), so
TRL computes the loss on the completion only; every example carries chat_template_kwargs
{"enable_thinking": false}, so Qwen3's template renders the empty think block of non-thinking mode, as
at inference. DeepSpeed ZeRO-3 (ds_zero3.json) partitions parameters, gradients and optimizer state
over every rank of every node. Eval loss on a validation split at the start and after every epoch; the
best epoch by eval loss is restored at the end and saved (16-bit weights gathered on save). Before
and after training, each rank generates greedily for its share of the held-out test split; the JSON
validity and field-level exact match of both models are reported side by side.
"""
from __future__ import annotations

import gc
import json
import sys
import time
from pathlib import Path

import deepspeed
import torch
import torch.distributed as dist
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.integrations.deepspeed import unset_hf_deepspeed_config
from trl import SFTConfig, SFTTrainer

from nbhelpers.metrics import peak_memory_bytes, write_metrics
from nbhelpers.trl_cpu import skip_deepspeed_shm_build, use_torch_loss

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # recipes/: recipe_common.py, what the recipes share
from extraction import evaluate_rows, summarize  # noqa: E402
from recipe_common import (gather_rank_facts, init_distributed, load_rows, parse_args, shutdown,  # noqa: E402
                           stop_clearly_if_a_peer_is_lost)


def held_out_scores(model_path, rows, cfg, device, rank, world_size) -> dict:
    """Greedy generation on this rank's share of the test rows (plain model, no DeepSpeed); summary of all ranks."""
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype).to(device)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    mine = rows.select(range(rank, len(rows), world_size))
    scores = evaluate_rows(model, tokenizer, mine, cfg["max_new_tokens"], cfg["generation_batch_size"])
    del model
    gc.collect()
    everyone = [None] * world_size
    dist.all_gather_object(everyone, scores)
    all_scores = [s for rank_scores in everyone for s in rank_scores]
    return {**summarize(all_scores), "examples": all_scores[:3]}


def main():
    cfg = vars(parse_args(HERE, __doc__.split("\n")[0]))
    device = init_distributed(cfg["timeout_s"])  # TRL/accelerate and DeepSpeed reuse this process group
    with stop_clearly_if_a_peer_is_lost(cfg["timeout_s"]):
        run(cfg, device, dist.get_rank(), dist.get_world_size(), Path(cfg["output_dir"]))
    shutdown()


def run(cfg, device, rank, world_size, output_dir):
    on_gpu = device.type == "cuda"
    if not on_gpu:
        skip_deepspeed_shm_build()  # no minutes of C++ JIT for a shared-memory all-reduce: gloo does that job
        use_torch_loss()  # TRL's token log-probabilities are a Triton (GPU) kernel; the same in PyTorch
    deepspeed.init_distributed(dist_backend=dist.get_backend())  # DeepSpeed's comm layer over our process group
    train_rows = load_rows(cfg["dataset"], "train")
    if cfg["train_samples"]:
        train_rows = train_rows.select(range(cfg["train_samples"]))
    test_rows = load_rows(cfg["dataset"], "test").select(range(cfg["eval_samples"]))
    # Thinking off: Qwen3's template then renders "<think>\n\n</think>\n\n" before the answer, as at inference.
    train_rows = train_rows.map(lambda row: {"chat_template_kwargs": {"enable_thinking": False}})
    splits = train_rows.train_test_split(test_size=cfg["validation_fraction"], seed=cfg["seed"])

    # Before fine-tuning: the base model on the held-out test rows.
    before = held_out_scores(cfg["model_name"], test_rows, cfg, device, rank, world_size)

    bf16 = cfg["bf16"] and on_gpu
    args = SFTConfig(
        output_dir=str(output_dir / "trainer"),
        deepspeed=str(HERE / cfg["deepspeed_config"]),  # ZeRO-3: from here on from_pretrained partitions on load
        num_train_epochs=cfg["epochs"],
        per_device_train_batch_size=cfg["batch_size"],
        per_device_eval_batch_size=cfg["batch_size"],
        gradient_accumulation_steps=cfg["grad_accum"],
        learning_rate=cfg["lr"],
        lr_scheduler_type="cosine",
        warmup_steps=cfg["warmup_steps"],  # < 1: a fraction of all steps
        weight_decay=cfg["weight_decay"],
        max_grad_norm=cfg["max_grad_norm"],
        bf16=bf16,
        fp16=False,
        use_cpu=not on_gpu,  # without it accelerate sees no GPU and no distributed run (world size 1)
        gradient_checkpointing=cfg["gradient_checkpointing"],
        gradient_checkpointing_kwargs={"use_reentrant": False},
        max_length=cfg["max_length"],
        completion_only_loss=True,
        model_init_kwargs={"dtype": torch.bfloat16 if bf16 else torch.float32},
        eval_strategy="epoch",
        eval_on_start=True,  # the eval loss before any training, for comparison
        save_strategy="epoch",
        save_total_limit=cfg["save_total_limit"],
        load_best_model_at_end=True,
        metric_for_best_model="eval_loss",
        greater_is_better=False,
        logging_steps=cfg["logging_steps"],
        include_num_input_tokens_seen=True,
        report_to="none",
        ddp_timeout=int(cfg["timeout_s"]),
        seed=cfg["seed"],
        disable_tqdm=rank != 0,
    )
    trainer = SFTTrainer(model=cfg["model_name"], args=args, train_dataset=splits["train"],
                         eval_dataset=splits["test"])
    # ZeRO-3: each parameter's local partition is p.ds_tensor (p itself is empty between uses).
    params = list(trainer.model.parameters())
    local_numel = sum(p.ds_tensor.numel() for p in params)
    total_numel = sum(p.ds_numel for p in params)

    started = time.perf_counter()
    result = trainer.train()
    train_seconds = time.perf_counter() - started
    trainer.save_model(str(output_dir / "final_model"))  # the best epoch (load_best_model_at_end), 16-bit, gathered
    history = trainer.state.log_history
    best_checkpoint = trainer.state.best_model_checkpoint
    tokens_seen = trainer.state.num_input_tokens_seen
    peak = peak_memory_bytes(device)
    if rank == 0:
        trainer.processing_class.save_pretrained(output_dir / "final_model")
    del trainer
    gc.collect()
    if on_gpu:
        torch.cuda.empty_cache()
    unset_hf_deepspeed_config()  # from_pretrained loads plainly again
    dist.barrier()

    # After fine-tuning: the saved best model on the same held-out rows.
    after = held_out_scores(output_dir / "final_model", test_rows, cfg, device, rank, world_size)

    facts = gather_rank_facts(local_shard_numel=local_numel, peak_memory_bytes=peak,
                              device=torch.cuda.get_device_name(device) if on_gpu else "cpu")
    if rank == 0:
        losses = [h["loss"] for h in history if "loss" in h]
        eval_losses = [h["eval_loss"] for h in history if "eval_loss" in h]
        path = write_metrics(
            output_dir, recipe="deepspeed_qwen3_8b_invoices", model_name=cfg["model_name"],
            world_size=world_size, nodes=len({f["node_rank"] for f in facts}), ranks=facts,
            parameters=total_numel, local_shard_numel=[f["local_shard_numel"] for f in facts],
            peak_memory_bytes=[f["peak_memory_bytes"] for f in facts],
            losses=losses, initial_loss=losses[0], final_loss=losses[-1],
            eval_losses=eval_losses, initial_eval_loss=eval_losses[0],
            best_eval_loss=min(eval_losses[1:] or eval_losses),
            best_checkpoint=best_checkpoint, train_seconds=train_seconds,
            samples_per_s=result.metrics.get("train_samples_per_second"),
            tokens_per_s=tokens_seen / train_seconds if tokens_seen else None,
            before=before, after=after, saved_model=str(output_dir / "final_model"), config=cfg)
        print(f"eval loss {eval_losses[0]:.4f} -> best {min(eval_losses[1:] or eval_losses):.4f}; held-out "
              f"JSON valid {before['json_valid']:.0%} -> {after['json_valid']:.0%}, field exact match "
              f"{before['field_exact_match']:.0%} -> {after['field_exact_match']:.0%}; metrics in {path}", flush=True)
    print(json.dumps({"rank": rank, "after": {k: after[k] for k in ("json_valid", "field_exact_match")}}))


if __name__ == "__main__":
    main()
