"""TRL SFT of Qwen3-8B on invoice/receipt -> JSON extraction with DeepSpeed ZeRO-3, one torchrun agent per node.

    torchrun --nnodes=N --nproc-per-node=G --rdzv-backend=c10d --rdzv-endpoint=HOST:29500 --rdzv-id=JOB \
        train.py [--config config.yaml] [--overrides FILE] [--any_sft_config_flag value ...]

Settings are read by TRL's own parser (TrlParser), as in TRL's sft.py: every field of ScriptArguments,
SFTConfig and ModelConfig, plus this recipe's few (InvoiceArguments), is a key of the YAML config (default:
config.yaml next to this file) and a flag; `--overrides FILE` changes a subset of the config's keys (Databricks' AI
Runtime passes a workload's `parameters` that way: workload.yaml). DeepSpeed is configured by its JSON (`--deepspeed ds_zero3.json`)
or by an accelerate config (`accelerate launch --config_file ...`).

The data is prompt/completion chat (the user turn holds the document, the assistant turn the JSON), so
TRL computes the loss on the completion only; every example carries chat_template_kwargs
{"enable_thinking": false}, so Qwen3's template renders the empty think block of non-thinking mode, as
at inference. DeepSpeed ZeRO-3 partitions parameters, gradients and optimizer state over every rank of
every node. Checkpoints are sealed after each save (nbhelpers.training.checkpoints) and a rerun resumes from the
newest verified one. Before and after training, each rank generates greedily for its share of the
held-out test split; the JSON validity and field-level exact match of both models are reported side by
side. Settings, metrics and the best model go to MLflow.
"""
from __future__ import annotations

import dataclasses
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
from trl import ModelConfig, ScriptArguments, SFTConfig, SFTTrainer, TrlParser

from nbhelpers.training import checkpoints
from nbhelpers.training.metrics import peak_memory_bytes, write_metrics
from nbhelpers.training.trainer_log import StepTimer

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # recipes/: recipe_common.py, what the recipes share
from extraction import evaluate_rows, summarize  # noqa: E402
from recipe_common import (config_with_overrides, gather_rank_facts, init_distributed, load_rows,  # noqa: E402
                           log_causal_lm, mlflow_run, shutdown, stop_clearly_if_a_peer_is_lost)

RECIPE = "deepspeed_qwen3_8b_invoices"


@dataclasses.dataclass
class InvoiceArguments:
    """This recipe's own settings; every other one is TRL's (ScriptArguments, SFTConfig, ModelConfig)."""
    validation_fraction: float = dataclasses.field(default=0.1, metadata={"help": "of the train split: eval loss"})
    max_train_samples: int = dataclasses.field(default=0, metadata={"help": "train rows used (0: all)"})
    max_predict_samples: int = dataclasses.field(default=100, metadata={"help": "held-out test rows generated for"})
    max_new_tokens: int = dataclasses.field(default=160, metadata={"help": "generated tokens per test row"})
    generation_batch_size: int = dataclasses.field(default=16, metadata={"help": "test rows per generate call"})
    mlflow_tracking_uri: str | None = dataclasses.field(
        default=None, metadata={"help": "default: sqlite:///<output_dir's parent>/mlflow.db"})


def parse_args(argv=None):
    """(ScriptArguments, SFTConfig, ModelConfig, InvoiceArguments) from the config file, then the flags."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--config" not in argv:
        argv = ["--config", str(HERE / "config.yaml"), *argv]
    overrides = None
    if "--overrides" in argv:  # a subset of the config's keys (TRL's --config replaces the whole file)
        at = argv.index("--overrides")
        overrides = argv[at + 1]
        del argv[at:at + 2]
    # the config with the overrides, and activation checkpointing's fields by this Transformers' names
    config_at = argv.index("--config") + 1
    argv[config_at] = str(config_with_overrides(argv[config_at], overrides))
    parser = TrlParser((ScriptArguments, SFTConfig, ModelConfig, InvoiceArguments))
    parser.set_defaults(use_cpu=not torch.cuda.is_available())  # accelerate sees no distributed run without it
    return parser.parse_args_and_config(argv)  # SFTConfig starts the process group (accelerate) and reads DeepSpeed's


def main():
    script_args, training_args, model_args, recipe_args = parse_args()
    device = init_distributed(training_args.ddp_timeout)
    output_dir = Path(training_args.output_dir)
    params = {**dataclasses.asdict(recipe_args), "dataset_name": script_args.dataset_name,
              "model_name_or_path": model_args.model_name_or_path}  # the Trainer's MLflow callback logs SFTConfig
    with (stop_clearly_if_a_peer_is_lost(training_args.ddp_timeout),
          mlflow_run(RECIPE, output_dir, recipe_args.mlflow_tracking_uri, params) as tracking):
        deepspeed.init_distributed(dist_backend=dist.get_backend())  # DeepSpeed's comm layer over this process group
        train_rows, test_rows = load_data(script_args, recipe_args, training_args.seed)
        before = held_out_scores(model_args.model_name_or_path, test_rows, recipe_args, device)
        if training_args.deepspeed_plugin:
            training_args.deepspeed_plugin.set_deepspeed_weakref()  # from here on from_pretrained partitions (ZeRO-3)
        trainer = make_trainer(script_args, training_args, model_args, train_rows)
        run = train(trainer, training_args)
        after = held_out_scores(output_dir / "final_model", test_rows, recipe_args, device)
        log_causal_lm(tracking, output_dir / "final_model")
        report(training_args, model_args, run, before, after, device, tracking)
    shutdown()


def load_data(script_args, recipe_args, seed: int):
    """The train rows split into train / validation (thinking off), and the held-out test rows."""
    train_rows = load_rows(script_args.dataset_name, script_args.dataset_train_split)
    if recipe_args.max_train_samples:
        train_rows = train_rows.select(range(recipe_args.max_train_samples))
    # Thinking off: Qwen3's template then renders "<think>\n\n</think>\n\n" before the answer, as at inference.
    train_rows = train_rows.map(lambda row: {"chat_template_kwargs": {"enable_thinking": False}})
    test_rows = load_rows(script_args.dataset_name, script_args.dataset_test_split)
    return (train_rows.train_test_split(test_size=recipe_args.validation_fraction, seed=seed),
            test_rows.select(range(min(recipe_args.max_predict_samples, len(test_rows)))))


def held_out_scores(model_path, rows, recipe_args, device) -> dict:
    """Greedy generation on this rank's share of the test rows (a plain model, not ZeRO-3 partitions); the summary of
    all ranks."""
    unset_hf_deepspeed_config()
    rank, world_size = dist.get_rank(), dist.get_world_size()
    model = AutoModelForCausalLM.from_pretrained(
        model_path, dtype=torch.bfloat16 if device.type == "cuda" else torch.float32).to(device)
    mine = rows.select(range(rank, len(rows), world_size))
    scores = evaluate_rows(model, AutoTokenizer.from_pretrained(model_path), mine, recipe_args.max_new_tokens,
                           recipe_args.generation_batch_size)
    del model
    gc.collect()
    everyone = [None] * world_size
    dist.all_gather_object(everyone, scores)
    all_scores = [s for rank_scores in everyone for s in rank_scores]
    return {**summarize(all_scores), "examples": all_scores[:3]}


def make_trainer(script_args, training_args, model_args, splits) -> SFTTrainer:
    """TRL's SFTTrainer as sft.py builds it, plus the callback that seals every checkpoint-N after it is saved and the
    one that times each rank's steps (at the end rank 0 names a rank that held the others back, and why)."""
    training_args.model_init_kwargs = {"dtype": model_args.dtype, "revision": model_args.model_revision,
                                       "attn_implementation": model_args.attn_implementation}
    return SFTTrainer(model=model_args.model_name_or_path, args=training_args, train_dataset=splits["train"],
                      eval_dataset=splits["test"], callbacks=[checkpoints.trainer_callback(),
                                                                      StepTimer(synchronize=False)])


def train(trainer, training_args) -> dict:
    """Resume from the newest verified checkpoint (or the one given), train, save the best epoch to final_model."""
    output_dir = Path(training_args.output_dir)
    # ZeRO-3: each parameter's local partition is p.ds_tensor (p itself is empty between uses).
    params = list(trainer.model.parameters())
    local_numel = sum(getattr(p, "ds_tensor", p).numel() for p in params)
    total_numel = sum(getattr(p, "ds_numel", p.numel()) for p in params)
    resume = training_args.resume_from_checkpoint or checkpoints.newest_verified(output_dir, "checkpoint-*")
    started = time.perf_counter()
    result = trainer.train(resume_from_checkpoint=str(resume) if resume else None)
    train_seconds = time.perf_counter() - started
    trainer.save_model(str(output_dir / "final_model"))  # the best epoch (load_best_model_at_end), 16-bit, gathered
    if dist.get_rank() == 0:
        trainer.processing_class.save_pretrained(output_dir / "final_model")
    checkpoints.seal(output_dir / "final_model")
    run = {"history": trainer.state.log_history, "best_checkpoint": trainer.state.best_model_checkpoint,
           "resumed_from": str(resume) if resume else None, "tokens_seen": trainer.state.num_input_tokens_seen,
           "train_seconds": train_seconds, "samples_per_s": result.metrics.get("train_samples_per_second"),
           "local_numel": local_numel, "total_numel": total_numel}
    del trainer
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    dist.barrier()
    return run


def report(training_args, model_args, run: dict, before: dict, after: dict, device, tracking) -> None:
    """metrics.json (rank 0): eval losses per epoch, the train loss curve, ZeRO-3 partitions, held-out scores."""
    facts = gather_rank_facts(local_shard_numel=run["local_numel"], peak_memory_bytes=peak_memory_bytes(device),
                              device=torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu")
    if dist.get_rank() != 0:
        return
    output_dir = Path(training_args.output_dir)
    losses = [h["loss"] for h in run["history"] if "loss" in h]
    eval_losses = [h["eval_loss"] for h in run["history"] if "eval_loss" in h]
    best_eval_loss = min(eval_losses[1:] or eval_losses)
    path = write_metrics(
        output_dir, recipe=RECIPE, model_name_or_path=model_args.model_name_or_path, world_size=len(facts),
        nodes=len({f["node_rank"] for f in facts}), ranks=facts, parameters=run["total_numel"],
        local_shard_numel=[f["local_shard_numel"] for f in facts], peak_memory_bytes=[f["peak_memory_bytes"] for f in facts],
        losses=losses, initial_loss=losses[0], final_loss=losses[-1], eval_losses=eval_losses,
        initial_eval_loss=eval_losses[0], best_eval_loss=best_eval_loss, best_checkpoint=run["best_checkpoint"],
        resumed_from=run["resumed_from"], train_seconds=run["train_seconds"], samples_per_s=run["samples_per_s"],
        tokens_per_s=run["tokens_seen"] / run["train_seconds"] if run["tokens_seen"] else None,
        before=before, after=after, saved_model=str(output_dir / "final_model"),
        config={"training": json.loads(training_args.to_json_string()), "model": dataclasses.asdict(model_args)})
    if tracking:
        tracking.log_metrics({f"{when}_{key}": scores[key] for when, scores in (("before", before), ("after", after))
                              for key in ("json_valid", "field_exact_match", "document_exact_match")})
    print(f"eval loss {eval_losses[0]:.4f} -> best {best_eval_loss:.4f}; held-out JSON valid {before['json_valid']:.0%} "
          f"-> {after['json_valid']:.0%}, field exact match {before['field_exact_match']:.0%} -> "
          f"{after['field_exact_match']:.0%}; metrics in {path}", flush=True)


if __name__ == "__main__":
    main()
