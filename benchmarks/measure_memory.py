"""Measured peak memory per GPU of a few training steps, next to nbhelpers.planner.plan's estimate.

    torchrun --nproc-per-node 2 benchmarks/measure_memory.py --arch llama-3.2-1b --seq-len 2048 \\
        --micro-batch 4 --technique ddp fsdp2 fsdp2+ckpt zero3 --out results/planner/llama.json

Each technique runs in turn in the same processes (one launch, so the GPU time goes to training), on a
randomly initialised full-size stand-in (tests/standins.py), bf16-mixed, AdamW, random tokens:
  ddp      fp32 weights, DistributedDataParallel, torch.autocast(bfloat16)
  fsdp2    fully_shard per decoder layer and the root, MixedPrecisionPolicy(bf16 params, fp32 reduce)
  zero3    DeepSpeed ZeRO-3, "bf16": {"enabled": true}, the same torch AdamW (no op builds)
  +ckpt    the model's activation_checkpointing_enable() (full activation checkpointing; gradient_ before 5.23)
After --warmup steps the allocator's peak is reset, so the figures are the steady state of the remaining
steps: torch.cuda.max_memory_allocated (what the planner's estimate without allowance predicts) and
max_memory_reserved per rank, and the device's used memory (total - free: adds the CUDA context and NCCL).
Rank 0 prints one JSON line per technique and writes them all to --out. Without GPUs it runs on CPU
processes (gloo) to check the logic; memory figures are then process RSS peaks, not comparable.
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import time
from pathlib import Path

import sys

import torch
import torch.distributed as dist

from nbhelpers.planner.plan import plan
from nbhelpers.training.activation_checkpointing import enable_checkpointing
from nbhelpers.training.metrics import environment, peak_memory_bytes

TESTS = Path(__file__).resolve().parents[1] / "tests"
sys.path[:0] = [str(TESTS), str(TESTS / "hooks")]  # the offline stand-ins and the CPU dry run's DeepSpeed fix
import standins  # noqa: E402
from cpu_fixes import skip_deepspeed_shm_build  # noqa: E402

PLANNER_KEY = {"ddp": "ddp", "fsdp2": "fsdp", "zero3": "zero3"}


def build(config, dev, dtype):
    from transformers import AutoModelForCausalLM

    with torch.device(dev):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.config.use_cache = False
    return model.train()


def adamw_step(model, optimizer, precision=None):
    """One training step(input_ids) -> loss of a causal LM, under `precision` (an autocast context) if given."""
    def step(ids):
        with precision or contextlib.nullcontext():
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss
    return step


def setup(technique: str, checkpointing: bool, config, dev, lr: float = 1e-5):
    """(model or engine, one training step(input_ids) -> loss)."""
    if technique == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        model = build(config, dev, torch.float32)
        if checkpointing:
            enable_checkpointing(model)
        model = DDP(model, device_ids=[dev.index] if dev.type == "cuda" else None)
        optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
        return (model, optimizer), adamw_step(model, optimizer, torch.autocast(dev.type, dtype=torch.bfloat16))

    if technique == "fsdp2":
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        model = build(config, dev, torch.float32)
        if checkpointing:
            enable_checkpointing(model)
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for layer in model.model.layers:
            fully_shard(layer, mp_policy=policy)
        fully_shard(model, mp_policy=policy)
        optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
        return (model, optimizer), adamw_step(model, optimizer)  # bf16 comes from the policy, not autocast

    if technique == "zero3":
        import deepspeed

        if dev.type == "cpu":  # CPU dry run: skip JIT-compiling DeepSpeed's shared-memory all-reduce (minutes)
            skip_deepspeed_shm_build()
        model = build(config, dev, torch.bfloat16)
        if checkpointing:
            enable_checkpointing(model)
        ds_config = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
                     "bf16": {"enabled": True}, "zero_optimization": {"stage": 3},
                     "zero_allow_untested_optimizer": True, "steps_per_print": 10**9}
        engine, *_ = deepspeed.initialize(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=lr),
                                          config=ds_config)

        def step(ids):
            loss = engine(input_ids=ids, labels=ids).loss
            engine.backward(loss)
            engine.step()
            return loss
        return (engine,), step
    raise ValueError(f"unknown technique {technique!r}: ddp, fsdp2 or zero3 (optionally +ckpt)")


def reset_peak(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
        torch.cuda.empty_cache()  # blocks cached during setup (e.g. FSDP2's unsharded init) are not the steady state
        torch.cuda.reset_peak_memory_stats(dev)


def measure(spec: str, config, args, dev) -> dict:
    technique, _, option = spec.partition("+")
    checkpointing = option == "ckpt"
    gc.collect()
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    baseline = torch.cuda.memory_allocated(dev) if dev.type == "cuda" else 0  # leftovers of earlier runs
    generator = torch.Generator().manual_seed(dist.get_rank())
    batches = [torch.randint(0, config.vocab_size, (args.micro_batch, args.seq_len), generator=generator).to(dev)
               for _ in range(args.steps)]
    started = time.perf_counter()
    held, step = setup(technique, checkpointing, config, dev)
    setup_s = time.perf_counter() - started
    losses = []
    for index, ids in enumerate(batches):
        if index == args.warmup:  # Adam states exist now: the rest is the steady state
            reset_peak(dev)
            timed = time.perf_counter()
        losses.append(step(ids).item())
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
        free, total = torch.cuda.mem_get_info(dev)
        mine = {"max_allocated": torch.cuda.max_memory_allocated(dev) - baseline,
                "max_reserved": torch.cuda.max_memory_reserved(dev), "device_used": total - free,
                "baseline_allocated": baseline, "total": total}
    else:
        mine = {"max_allocated": peak_memory_bytes(dev), "max_reserved": None, "device_used": None,
                "baseline_allocated": 0, "total": None}
    mine["step_s"] = (time.perf_counter() - timed) / (args.steps - args.warmup)
    ranks = [None] * dist.get_world_size()
    dist.all_gather_object(ranks, mine)
    del held, step
    gc.collect()

    memory_gib = (ranks[0]["total"] or 80 * 2**30) / 2**30
    estimate = plan(config, gpus=dist.get_world_size(), gpu_memory_gib=memory_gib, precision="bf16-mixed",
                    seq_len=args.seq_len, micro_batch=args.micro_batch, checkpointing=checkpointing,
                    suggest=False).estimate(PLANNER_KEY[technique])
    peak = max(r["max_allocated"] for r in ranks)
    return {
        "technique": technique, "checkpointing": checkpointing, "arch": args.arch, "size": args.size,
        "layers": config.num_hidden_layers, "seq_len": args.seq_len, "micro_batch": args.micro_batch,
        "world_size": dist.get_world_size(), "precision": "bf16-mixed", "device": dev.type,
        "steps": args.steps, "warmup": args.warmup, "losses": losses, "setup_s": setup_s,
        "ranks": ranks, "measured_max_allocated_gib": peak / 2**30,
        "measured_max_reserved_gib": max((r["max_reserved"] or 0) for r in ranks) / 2**30,
        "measured_device_used_gib": max((r["device_used"] or 0) for r in ranks) / 2**30,
        "planner": {"allocated_gib": estimate.allocated, "total_gib": estimate.total,
                    "terms_gib": {k: getattr(estimate, k) for k in ("parameters", "gradients", "optimizer",
                                                                     "activations", "temporaries", "allowance")}},
        "estimate_vs_measured": estimate.allocated / (peak / 2**30) - 1 if peak else None,
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--arch", default="llama-3.2-1b", choices=list(standins.ARCHS))
    parser.add_argument("--size", default="full", choices=standins.SIZES)
    parser.add_argument("--layers", type=int, default=None, help="override the depth (e.g. a few MoE layers)")
    parser.add_argument("--technique", nargs="+", default=["ddp", "fsdp2", "zero3"],
                        help="ddp, fsdp2, zero3, each optionally +ckpt; run in this order")
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--micro-batch", type=int, default=4)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--out", default=None, help="JSON file for rank 0's results")
    args = parser.parse_args(argv)
    assert args.steps > args.warmup, "--steps must exceed --warmup"

    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(dev)
    config = standins.config(args.arch, args.size, layers=args.layers)
    results = []
    for spec in args.technique:
        try:
            result = measure(spec, config, args, dev)
        except Exception as error:  # one failing technique must not cost the others' GPU time
            result = {"technique": spec, "arch": args.arch, "error": f"{type(error).__name__}: {error}"[:2000]}
            if cuda:
                torch.cuda.empty_cache()
        results.append(result)
        if dist.get_rank() == 0:
            print(json.dumps({k: v for k, v in result.items() if k not in ("ranks", "losses")}), flush=True)
            if args.out:
                Path(args.out).parent.mkdir(parents=True, exist_ok=True)
                Path(args.out).write_text(json.dumps({"environment": environment(), "results": results}, indent=2))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
