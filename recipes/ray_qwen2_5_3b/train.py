"""Full fine-tune of Qwen2.5-3B on alpaca-style instructions with Ray Train (DDP, bf16 autocast on GPUs).

    python recipes/ray_qwen2_5_3b/train.py --num_workers 2                                   # one node
    RAY_ADDRESS=HEAD:6379 python recipes/ray_qwen2_5_3b/train.py --num_workers 16 \\
        --storage_path /shared/ray_results                                                  # a cluster

Defaults are in config.yaml (Qwen/Qwen2.5-3B, tatsu-lab/alpaca, max_length 1024, batch 4 per worker, AdamW
2e-5, clip 1.0, 100 steps); every key is a flag (`--learning_rate 1e-5`), `--config my.yaml` changes any of
them. `--model_name_or_path` takes a hub id or a local folder, `--dataset_name` a hub dataset id, a local
JSON/JSONL file or a folder with train.jsonl (instruction/input/output).

Examples are rendered with the Alpaca prompt, the loss is on the response tokens only, and examples are
packed into full `max_length` blocks (so tokens/s counts real tokens). Weights stay fp32 (the optimizer's
master copy) and the forward/backward runs under bf16 autocast on GPUs: a pure-bf16 AdamW would drop
updates of size 2e-5. Every `logging_steps` steps the workers report the mean loss and tokens/s through
`ray.train.report`; at the end rank 0 saves the model (bf16 safetensors) and tokenizer, seals the folder
(nbhelpers.training.checkpoints: a manifest of checksums) and reports it as the run's checkpoint, which Ray Train
copies under the storage path. The driver verifies that copy, writes OUTPUT_DIR/metrics.json and logs the
settings, the loss curve and the model to MLflow. Every `save_steps` steps rank 0 reports a checkpoint of the
weights, the optimizer state and the loss curve; a worker that dies makes Ray Train restart the group (up to
`max_failures` times), which resumes from the newest verified checkpoint on the batches it had not seen, and so
does a rerun of the same `run_name`.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import os
import random
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist
from transformers import AutoModelForCausalLM, AutoTokenizer

import ray
import ray.train
import ray.train.torch
from ray.train import Checkpoint, FailureConfig, RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer

import nbhelpers
from nbhelpers.planner.fits import fit_activations
from nbhelpers.training import checkpoints
from nbhelpers.training.activation_checkpointing import checkpointing_field, enable_checkpointing

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # recipes/: recipe_common.py, what the recipes share
import recipe_common  # noqa: E402
from recipe_common import (alpaca_prompt, load_rows, log_causal_lm, mlflow_run, newest_ray_checkpoint,  # noqa: E402
                           parse_settings)

RECIPE = "ray_qwen2_5_3b"


@dataclass
class Settings:
    """config.yaml's keys, each also a flag (`--max_steps 10`): their types here, their values and meanings there."""
    model_name_or_path: str
    dataset_name: str
    output_dir: str
    num_workers: int
    use_gpu: bool | None
    max_steps: int
    max_length: int
    per_device_train_batch_size: int
    learning_rate: float
    weight_decay: float
    max_grad_norm: float
    bf16: bool
    gradient_checkpointing: bool | None
    logging_steps: int
    timing_warmup_steps: int
    save_steps: int
    save_total_limit: int
    max_failures: int
    save_final_model: bool
    seed: int
    storage_path: str | None
    run_name: str
    ray_address: str | None
    mlflow_tracking_uri: str | None
    fail_once_at_step: int | None = field(default=None, metadata={"help": argparse.SUPPRESS})  # test hook


def main(argv=None) -> None:
    args = parse_settings(Settings, HERE, __doc__.split("\n")[0], argv)
    if args.save_steps % args.logging_steps:
        raise SystemExit(f"save_steps ({args.save_steps}) must be a multiple of logging_steps ({args.logging_steps}): "
                         "a checkpoint holds the loss curve up to a logged step")
    for key in ("model_name_or_path", "dataset_name", "output_dir"):  # local paths: absolute, as workers run elsewhere
        if os.path.exists(os.path.expanduser(getattr(args, key))) or key == "output_dir":
            setattr(args, key, os.path.abspath(os.path.expanduser(getattr(args, key))))
    args.storage_path = args.storage_path or os.path.join(args.output_dir, "ray_results")
    args.experiment_dir = os.path.join(args.storage_path, args.run_name)  # where Ray Train copies the checkpoints
    args.fail_marker = os.path.join(args.output_dir, "killed_worker.marker")
    os.environ.setdefault("RAY_TRAIN_ENABLE_PRINT_PATCH", "0")  # worker prints reach us once, not twice
    # Every node gets the code the workers import: recipe_common (not installed) and nbhelpers.
    ray.init(address=args.ray_address, runtime_env={"py_modules": [recipe_common, nbhelpers]})
    use_gpu = args.use_gpu if args.use_gpu is not None else ray.cluster_resources().get("GPU", 0) > 0
    with mlflow_run(RECIPE, args.output_dir, args.mlflow_tracking_uri, vars(args)) as tracking:
        trainer = TorchTrainer(train_loop_per_worker, train_loop_config=vars(args),
                               scaling_config=ScalingConfig(num_workers=args.num_workers, use_gpu=use_gpu),
                               run_config=RunConfig(name=args.run_name, storage_path=args.storage_path,
                                                    failure_config=FailureConfig(max_failures=args.max_failures)))
        started = time.perf_counter()
        result = trainer.fit()
        report(args, result, use_gpu, time.perf_counter() - started, tracking)


# --------------------------------------------------------------------------------------------------
# What every Ray Train worker runs: plain PyTorch + transformers, with Ray's DDP/sampler helpers
# --------------------------------------------------------------------------------------------------
def packed_blocks(rows, tokenizer, seq_len: int, blocks_needed: int, seed: int) -> list[dict]:
    """Tokenize shuffled rows (prompt tokens masked out of the labels) and pack them into blocks of exactly
    `seq_len` tokens, until `blocks_needed` blocks exist (or the data runs out)."""
    order = list(range(len(rows)))
    random.Random(seed).shuffle(order)
    ids, labels, blocks = [], [], []
    for index in order:
        row = rows[index]
        prompt = tokenizer(alpaca_prompt(row), add_special_tokens=False)["input_ids"]
        response = tokenizer(row["output"], add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        ids += prompt + response
        labels += [-100] * len(prompt) + response
        while len(ids) >= seq_len:
            blocks.append({"input_ids": torch.tensor(ids[:seq_len]), "labels": torch.tensor(labels[:seq_len])})
            ids, labels = ids[seq_len:], labels[seq_len:]
        if len(blocks) >= blocks_needed:
            break
    if not blocks:
        raise ValueError(f"the data holds fewer than max_length={seq_len} tokens")
    return blocks


def die_once(config: dict, step: int, rank: int, world_size: int) -> None:
    """Test hook (--fail_once_at_step): right after that step, the last rank kills itself, once (a marker file
    remembers), as a worker on a lost node would die."""
    marker = config["fail_marker"]
    if config.get("fail_once_at_step") != step or rank != world_size - 1 or os.path.exists(marker):
        return
    Path(marker).write_text(f"rank {rank} killed itself after step {step}\n")
    print(f"[test hook] rank {rank}: SIGKILL after step {step}", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


def save_state(step: int, model, optimizer, history: list, keep: int, experiment_dir: str, rank: int, world_size: int,
               metrics: dict) -> None:
    """Every worker reports `metrics` (it is a barrier); rank 0 attaches a checkpoint of the weights, the optimizer
    and the history (DDP keeps the replicas identical: one copy is the checkpoint), sealed before Ray copies it."""
    with tempfile.TemporaryDirectory() as folder:
        checkpoint = None
        if rank == 0:
            torch.save({"step": step, "model": (model.module if world_size > 1 else model).state_dict(),
                        "optimizer": optimizer.state_dict(), "history": history}, os.path.join(folder, "checkpoint.pt"))
            checkpoint = Checkpoint.from_directory(checkpoints.seal(folder, {"step": step}, no_dist=True))
        ray.train.report(metrics, checkpoint=checkpoint)
    if rank == 0:  # Ray has copied it: keep the newest `keep`, never the newest verified one
        checkpoints.rotate(experiment_dir, keep, "checkpoint_*")


def checkpointed_every_n_layers(config: dict, rank: int, world_size: int) -> int | None:
    """Gradient checkpointing of every n-th decoder layer (1: all of them), None for none: config's
    gradient_checkpointing (true: every layer); null: none where the memory planner says the run fits this GPU
    without, else as few layers as fit. Rank 0 says the planner's verdict in one line (every worker comes to the same),
    with the time max_steps take."""
    shape = dict(gpus=world_size, seq_len=config["max_length"], fused_adamw=True,
                 gradient_as_bucket_view=True,  # as train_loop_per_worker trains
                 max_steps=config["max_steps"], torch_compile=False, framework="pytorch")
    with contextlib.redirect_stderr(sys.stderr if rank == 0 else io.StringIO()):
        fit = fit_activations(config["model_name_or_path"], "ddp", gradient_checkpointing=config["gradient_checkpointing"],
                              per_device_train_batch_size=config["per_device_train_batch_size"], **shape)
    if config["gradient_checkpointing"] is not None:
        return 1 if config["gradient_checkpointing"] else None
    field = checkpointing_field()  # activation checkpointing's TrainingArguments field in this Transformers
    return fit[f"{field}_kwargs"]["every_n_layers"] if fit.get(field) else None


def train_loop_per_worker(config: dict) -> list[dict]:
    context = ray.train.get_context()
    rank, world_size = context.get_world_rank(), context.get_world_size()
    device = ray.train.torch.get_device()
    bf16 = config["bf16"] and device.type == "cuda"
    torch.manual_seed(config["seed"])

    tokenizer = AutoTokenizer.from_pretrained(config["model_name_or_path"])
    batch_size, max_steps = config["per_device_train_batch_size"], config["max_steps"]
    blocks = packed_blocks(load_rows(config["dataset_name"]), tokenizer, config["max_length"],
                           max_steps * batch_size * world_size, config["seed"])
    loader = ray.train.torch.prepare_data_loader(  # Ray: adds a DistributedSampler, moves batches to the device
        torch.utils.data.DataLoader(blocks, batch_size=batch_size, shuffle=True, drop_last=True))

    every_n_layers = checkpointed_every_n_layers(config, rank, world_size)
    model = AutoModelForCausalLM.from_pretrained(config["model_name_or_path"], dtype=torch.float32)  # fp32 master
    history, step = [], 0
    resumed_from, state = newest_ray_checkpoint(config["experiment_dir"])  # after a failure, or a rerun
    if state is not None:
        model.load_state_dict(state["model"])
        step, history = state["step"], state["history"]
        print(f"rank {rank}: resuming from {resumed_from} (step {step})", flush=True)
    if every_n_layers:
        enable_checkpointing(model, every_n_layers=every_n_layers, use_reentrant=False)
    # Ray: onto this worker's GPU, wrapped in DDP, whose gradients are views into its all-reduce buckets (no second
    # copy: 12 GB at 3B parameters); fused AdamW steps in place (no sqrt(v) temporary: 12 GB more)
    model = ray.train.torch.prepare_model(model, parallel_strategy_kwargs={"gradient_as_bucket_view": True})
    optimizer = torch.optim.AdamW(model.parameters(), lr=config["learning_rate"], weight_decay=config["weight_decay"],
                                  fused=device.type == "cuda")
    if state is not None:
        optimizer.load_state_dict(state["optimizer"])  # after the move: its state follows the parameters

    tokens_per_step = batch_size * config["max_length"] * world_size
    timed_from, loss_sum, started_at = None, torch.zeros((), device=device), step
    epoch, skip = divmod(step, len(loader))  # a resumed run goes on with the batches it had not seen
    model.train()
    while step < max_steps:
        if world_size > 1:
            loader.sampler.set_epoch(epoch)
        for batch in loader:
            if skip:
                skip -= 1
                continue
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
                loss = model(input_ids=batch["input_ids"], labels=batch["labels"]).loss
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), config["max_grad_norm"])
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            loss_sum += loss.detach()
            if step == started_at + 1:
                checkpoints.check_resumed_loss(loss.item(), resumed_from)
            if step == started_at + config["timing_warmup_steps"]:
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                timed_from = (step, time.perf_counter())
            if step % config["logging_steps"] == 0 or step == max_steps:
                steps_logged = step - (history[-1]["step"] if history else 0)
                if dist.is_initialized():
                    dist.all_reduce(loss_sum)  # the mean over every worker's batches
                tokens_per_s = timed_steps = timed_seconds = None
                if timed_from and step > timed_from[0]:
                    if device.type == "cuda":
                        torch.cuda.synchronize(device)
                    timed_steps, timed_seconds = step - timed_from[0], time.perf_counter() - timed_from[1]
                    tokens_per_s = timed_steps * tokens_per_step / timed_seconds
                metrics = {"step": step, "loss": loss_sum.item() / steps_logged / world_size,
                           "grad_norm": grad_norm.item(), "tokens_per_s": tokens_per_s, "world_size": world_size,
                           "started_at_step": started_at, "timed_steps": timed_steps, "timed_seconds": timed_seconds}
                if device.type == "cuda":
                    metrics["peak_memory_bytes"] = torch.cuda.max_memory_allocated(device)
                history.append(metrics)
                loss_sum.zero_()
                if rank == 0:
                    rate = f"{tokens_per_s:,.0f} tokens/s" if tokens_per_s else "warming up"
                    print(f"step {step}/{max_steps}: loss {metrics['loss']:.4f}, {rate}", flush=True)
                if config["save_steps"] and step % config["save_steps"] == 0 and step < max_steps:
                    save_state(step, model, optimizer, history, config["save_total_limit"], config["experiment_dir"],
                               rank, world_size, metrics)
                else:
                    ray.train.report(metrics)  # every worker reports: it is a barrier
            die_once(config, step, rank, world_size)
            if step >= max_steps:
                break
        epoch += 1

    if config["save_final_model"]:
        with tempfile.TemporaryDirectory() as folder:
            checkpoint = None
            if rank == 0:
                unwrapped = model.module if world_size > 1 else model
                state = {k: v.to(torch.bfloat16) for k, v in unwrapped.state_dict().items()}
                unwrapped.save_pretrained(folder, state_dict=state)
                tokenizer.save_pretrained(folder)
                checkpoint = Checkpoint.from_directory(checkpoints.seal(folder, {"step": step, "final_model": True},
                                                                        no_dist=True))
            ray.train.report(history[-1], checkpoint=checkpoint)  # Ray copies the folder, manifest included
    return history


# --------------------------------------------------------------------------------------------------
# The driver, after the run
# --------------------------------------------------------------------------------------------------
def report(args, result, use_gpu: bool, wall_s: float, tracking) -> None:
    """metrics.json, and the loss curve and the verified final model in MLflow."""
    from nbhelpers.training.metrics import write_metrics

    history = result.return_value  # rank 0's list of logged steps
    losses = [h["loss"] for h in history]
    timed = [h for h in history if h["tokens_per_s"]]  # each: since this worker group's warm-up, to its step
    last = timed[-1] if timed else {}
    saved = None
    if result.checkpoint:
        saved = Path(result.checkpoint.path)
        checkpoints.verify(saved)  # Ray's copy under the storage path, against the manifest rank 0 wrote
    path = write_metrics(
        args.output_dir, recipe=RECIPE, model_name_or_path=args.model_name_or_path,
        world_size=history[-1]["world_size"], use_gpu=use_gpu, max_length=args.max_length,
        per_device_train_batch_size=args.per_device_train_batch_size, max_steps=args.max_steps, history=history,
        losses=losses, initial_loss=losses[0], final_loss=losses[-1],
        tokens_per_s=last.get("tokens_per_s"),  # every worker's tokens of the timed steps over their seconds:
        timed_steps=last.get("timed_steps"), timed_seconds=last.get("timed_seconds"),  # the steps after the warm-up
        peak_memory_bytes=history[-1].get("peak_memory_bytes"),  # rank 0's
        checkpoint=str(saved) if saved else None, wall_s=wall_s,
        worker_group_starts=sorted({h["started_at_step"] for h in history}),
        killed_worker=os.path.exists(args.fail_marker))
    for h in history:
        tracking.log_metrics({k: h[k] for k in ("loss", "grad_norm", "tokens_per_s") if h[k] is not None},
                             step=h["step"])
    if saved:
        log_causal_lm(tracking, saved)
    rate = f"{last['tokens_per_s']:,.0f} tokens/s" if timed else "no timed steps"
    print(f"final: loss {losses[0]:.4f} -> {losses[-1]:.4f}, {rate} on {history[-1]['world_size']} workers -> {path}")


if __name__ == "__main__":
    main()
