"""FSDP2 fine-tune of a Qwen3 model on alpaca-style data, one torchrun agent per node.

    torchrun --nnodes=N --nproc-per-node=G --rdzv-backend=c10d --rdzv-endpoint=HOST:29500 --rdzv-id=JOB \
        train.py --config config.yaml [--key value ...]

FSDP2: `fully_shard` on every decoder layer, then on the root (embeddings, final norm, lm_head), with
MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32): compute in bf16, fp32 master weights and
gradient reduction. Sequence packing: samples are concatenated into rows of seq_len tokens and their
position_ids restart at 0 for each sample; with attention_mask=None transformers (>= 5) reads the
restarts and builds a block-diagonal causal mask (sdpa) or BlockMask (flex_attention), so a sample
never attends to its neighbours. Loss on responses only. Non-reentrant activation checkpointing, fused
AdamW on GPU, torch.compile per decoder layer, a distributed checkpoint (torch.distributed.checkpoint)
every `checkpoint_every` steps, resumed automatically. `synthetic_data` + `random_init` turn it into the
throughput benchmark (see README.md).
"""
from __future__ import annotations

import json
import math
import random
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn.functional as F
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict, get_state_dict,
                                                     set_state_dict)
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from tqdm import tqdm
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from nbhelpers import checkpoints
from nbhelpers.metrics import peak_memory_bytes, write_metrics
from nbhelpers.recipes import (FLOP_FORMULA, alpaca_prompt, flops_per_token, gather_rank_facts, init_distributed,
                               load_rows, matmul_parameters, parse_config, peak_flops, shutdown,
                               stop_clearly_if_a_peer_is_lost, tokenize_prompt_response)

DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16}


# --------------------------------------------------------------------------------------------------
# Data: tokenized samples packed into rows; each sample keeps its own position ids
# --------------------------------------------------------------------------------------------------
def pack(samples: list[tuple[list, list]], seq_len: int, pad_id: int) -> list[dict]:
    """Concatenate (input_ids, labels) samples into rows of exactly seq_len tokens.

    position_ids restart at 0 for every sample (that is what keeps attention inside a sample); the
    padding at a row's end is its own segment, restarting at 0 too, with labels -100.
    """
    rows, ids, labels, positions = [], [], [], []

    def close_row():
        pad = seq_len - len(ids)
        rows.append({"input_ids": ids + [pad_id] * pad, "labels": labels + [-100] * pad,
                     "position_ids": positions + list(range(pad))})

    for sample_ids, sample_labels in samples:
        sample_ids, sample_labels = sample_ids[:seq_len], sample_labels[:seq_len]
        if len(ids) + len(sample_ids) > seq_len:
            close_row()
            ids, labels, positions = [], [], []
        ids, labels = ids + sample_ids, labels + sample_labels
        positions = positions + list(range(len(sample_ids)))
    if ids:
        close_row()
    return rows


def packed_batches(samples, seq_len, batch_size, pad_id, rank, world_size, seed):
    """Endless batches of packed rows for this rank: reshuffled and repacked every epoch, the same order on a rerun."""
    epoch = 0
    while True:
        order = list(range(len(samples)))
        random.Random(seed + epoch).shuffle(order)
        rows = pack([samples[i] for i in order], seq_len, pad_id)
        per_rank = len(rows) // world_size // batch_size * batch_size  # every rank runs the same number of steps
        if per_rank == 0:
            raise ValueError(f"{len(rows)} packed rows cannot give {world_size} ranks a batch of {batch_size}; "
                             "use more data, a smaller batch_size or a smaller seq_len")
        mine = rows[rank::world_size][:per_rank]
        for start in range(0, per_rank, batch_size):
            chunk = mine[start:start + batch_size]
            yield {key: torch.tensor([row[key] for row in chunk]) for key in ("input_ids", "labels", "position_ids")}
        epoch += 1


def synthetic_batches(vocab_size, seq_len, batch_size, device, seed):
    """Random full-length sequences, every token labelled: the same work as a plain pre-training loop."""
    generator = torch.Generator(device=device).manual_seed(seed)
    while True:
        tokens = torch.randint(0, vocab_size, (batch_size, seq_len + 1), device=device, generator=generator)
        yield {"input_ids": tokens[:, :-1], "labels": tokens[:, 1:], "position_ids": None}


def cross_entropy_sum(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Summed token loss in fp32 (compiled on GPU: the upcast and log-softmax fuse into one pass over the logits)."""
    return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), ignore_index=-100, reduction="sum")


def learning_rate(step: int, cfg: dict) -> float:
    if step < cfg["warmup_steps"]:
        return cfg["lr"] * (step + 1) / cfg["warmup_steps"]
    progress = (step - cfg["warmup_steps"]) / max(1, cfg["max_steps"] - cfg["warmup_steps"])
    floor = cfg["lr"] * cfg["min_lr_ratio"]
    return floor + 0.5 * (cfg["lr"] - floor) * (1 + math.cos(math.pi * min(1.0, progress)))


# --------------------------------------------------------------------------------------------------
# Distributed checkpoint: every rank writes its own shards; resumable on any number of ranks
# --------------------------------------------------------------------------------------------------
def save_checkpoint(model, optimizer, step: int, losses: list, checkpoint_dir: Path, keep: int) -> Path:
    """step_N, written as nbhelpers.checkpoints does: into step_N.tmp, manifest last, renamed into place."""
    path = checkpoint_dir / f"step_{step:07d}"
    model_state, optimizer_state = get_state_dict(model, optimizer)
    with checkpoints.saving(path, {"step": step, "losses": losses}, keep=keep) as folder:
        dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=folder)
    return path


def resume(model, optimizer, checkpoint_dir: Path) -> tuple[Path | None, int, list]:
    """Load the newest checkpoint whose every shard verifies: (its folder, its step, the losses so far); (None, 0, [])."""
    path = checkpoints.newest_verified(checkpoint_dir, "step_*")
    if path is None:
        return None, 0, []
    model_state, optimizer_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optimizer": optimizer_state}
    dcp.load(state, checkpoint_id=path)
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
    metadata = checkpoints.read_metadata(path)
    return path, metadata["step"], metadata["losses"]


def main():
    cfg = parse_config(__doc__.split("\n")[0])
    device = init_distributed(cfg["timeout_s"])
    rank, world_size = dist.get_rank(), dist.get_world_size()
    output_dir = Path(cfg["output_dir"])
    on_gpu = device.type == "cuda"
    torch.manual_seed(cfg["seed"])
    with stop_clearly_if_a_peer_is_lost(cfg["timeout_s"]):
        train(cfg, device, rank, world_size, output_dir, on_gpu)
    shutdown()


def train(cfg, device, rank, world_size, output_dir, on_gpu):
    # Model: every rank loads the checkpoint on CPU in fp32 (the master weights), or builds random weights
    # directly on its GPU for the benchmark (`random_init`: a config-only stand-in is enough).
    attn = cfg["attn_implementation"]
    if cfg["random_init"]:
        config = AutoConfig.from_pretrained(cfg["model_name"])
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation=attn)
    else:
        model = AutoModelForCausalLM.from_pretrained(cfg["model_name"], dtype=torch.float32, attn_implementation=attn)
    model.config.use_cache = False
    n_parameters = sum(p.numel() for p in model.parameters())
    n_matmul_parameters = matmul_parameters(model)
    flops_token = flops_per_token(model, cfg["seq_len"])  # counted before sharding
    if cfg["activation_checkpointing"]:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})

    # FSDP2: one FSDP unit per decoder layer (its all-gather overlaps the previous layer's compute), then
    # the root for what is left.
    mp_policy = MixedPrecisionPolicy(param_dtype=DTYPES[cfg["param_dtype"]], reduce_dtype=DTYPES[cfg["reduce_dtype"]])
    layers = model.model.layers
    for layer in layers:
        if cfg["compile"]:  # the layer's forward only: FSDP's hooks around it stay eager; one graph serves every layer
            layer.forward = torch.compile(layer.forward)
        fully_shard(layer, mp_policy=mp_policy, reshard_after_forward=cfg["reshard_after_forward"])
    fully_shard(model, mp_policy=mp_policy, reshard_after_forward=cfg["reshard_after_forward"])
    model.to(device)  # moves each rank's shard only
    local_numel = sum(p.to_local().numel() for p in model.parameters())
    loss_fn = torch.compile(cross_entropy_sum) if cfg["compile"] else cross_entropy_sum
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg["lr"], weight_decay=cfg["weight_decay"],
                                  betas=(0.9, 0.95), fused=on_gpu)

    # Resume from the newest checkpoint that verifies, if any.
    checkpoint, start_step, losses = resume(model, optimizer, output_dir / "checkpoints") if cfg["resume"] \
        else (None, 0, [])
    resumed_from = start_step if checkpoint else None
    if checkpoint and rank == 0:
        print(f"resumed from {checkpoint} (step {start_step})", flush=True)

    # Data
    if cfg["synthetic_data"]:
        batches = synthetic_batches(model.config.vocab_size, cfg["seq_len"], cfg["batch_size"], device,
                                    cfg["seed"] + rank)
    else:
        tokenizer = AutoTokenizer.from_pretrained(cfg["model_name"])
        rows = load_rows(cfg["dataset"], "train")
        samples = [tokenize_prompt_response(tokenizer, alpaca_prompt(row), row["output"], cfg["seq_len"])
                   for row in rows]
        pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        batches = packed_batches(samples, cfg["seq_len"], cfg["batch_size"], pad_id, rank, world_size, cfg["seed"])
        for _ in range(start_step * cfg["grad_accum"]):  # the same data order as an uninterrupted run
            next(batches)

    nodes = len({f["node_rank"] for f in gather_rank_facts()})
    if rank == 0:
        print(f"{world_size} ranks on {nodes} node(s); {n_parameters / 1e6:.1f} M parameters, "
              f"{local_numel / 1e6:.1f} M on rank 0; steps {start_step}..{cfg['max_steps']}", flush=True)

    model.train()
    step_losses = []  # this run's per-step loss tensors; read back (a GPU sync) only every log_every steps
    timing_from = start_step + cfg["timing_warmup_steps"]  # steps before it warm up (and compile)
    timed_start, first_step_s = None, None
    saved = []
    progress = tqdm(range(start_step, cfg["max_steps"]), disable=rank != 0, desc="train", mininterval=5)
    for step in progress:
        if step == timing_from:
            if on_gpu:
                torch.cuda.synchronize()
            timed_start = time.perf_counter()
        step_started = time.perf_counter()
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, cfg)
        micro_batches = [next(batches) for _ in range(cfg["grad_accum"])]
        # Mean over every labelled token of the step on all ranks: FSDP averages gradients over ranks,
        # so each rank scales its summed loss by world_size / (labelled tokens everywhere).
        n_tokens = sum((mb["labels"] != -100).sum() for mb in micro_batches).to(device, torch.float32)
        dist.all_reduce(n_tokens)
        step_loss = torch.zeros((), device=device)
        for i, mb in enumerate(micro_batches):
            model.set_requires_gradient_sync(i == len(micro_batches) - 1)  # reduce-scatter once per step
            position_ids = mb["position_ids"].to(device) if mb["position_ids"] is not None else None
            logits = model(input_ids=mb["input_ids"].to(device), position_ids=position_ids).logits
            loss_sum = loss_fn(logits, mb["labels"].to(device))
            (loss_sum * world_size / n_tokens).backward()
            step_loss += loss_sum.detach()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg["max_grad_norm"])
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        dist.all_reduce(step_loss)
        step_losses.append(step_loss / n_tokens)
        if step == start_step:
            first_step_s = time.perf_counter() - step_started  # includes torch.compile
            checkpoints.check_resumed_loss(step_losses[0].item(), checkpoint)
        done = step + 1
        if done % cfg["log_every"] == 0 or done == cfg["max_steps"]:
            progress.set_postfix(loss=f"{step_losses[-1].item():.4f}")
            if rank == 0:
                print(f"step {done} loss {step_losses[-1].item():.4f} lr {learning_rate(step, cfg):.2e}", flush=True)
        if cfg["checkpoint_every"] and done % cfg["checkpoint_every"] == 0 and done < cfg["max_steps"]:
            saved.append(str(save_checkpoint(model, optimizer, done, losses + [x.item() for x in step_losses],
                                             output_dir / "checkpoints", cfg["keep_checkpoints"])))
    if on_gpu:
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - timed_start if timed_start is not None else None
    timed_steps = cfg["max_steps"] - timing_from if elapsed else 0
    losses = losses + [x.item() for x in step_losses]

    if cfg["save_final_model"]:
        # Gathers the full state dict to rank 0's CPU: fine up to a few B parameters.
        full_state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if rank == 0:
            model.save_pretrained(output_dir / "final_model", state_dict=full_state)
            AutoTokenizer.from_pretrained(cfg["model_name"]).save_pretrained(output_dir / "final_model")
        dist.barrier()

    tokens_per_step = cfg["batch_size"] * cfg["seq_len"] * cfg["grad_accum"] * world_size
    tokens_per_s = tokens_per_step * timed_steps / elapsed if elapsed and timed_steps else None
    peak = peak_flops(device, cfg["peak_tflops"] * 1e12 if cfg["peak_tflops"] else None)
    facts = gather_rank_facts(local_shard_numel=local_numel, peak_memory_bytes=peak_memory_bytes(device),
                              peak_reserved_bytes=torch.cuda.max_memory_reserved(device) if on_gpu else None,
                              device=torch.cuda.get_device_name(device) if on_gpu else "cpu")
    if rank == 0:
        tokens_per_s_per_gpu = tokens_per_s / world_size if tokens_per_s else None
        metrics = write_metrics(
            output_dir, recipe="fsdp2_qwen3_multinode", model_name=cfg["model_name"],
            world_size=world_size, nodes=len({f["node_rank"] for f in facts}), ranks=facts,
            parameters=n_parameters, matmul_parameters=n_matmul_parameters,
            local_shard_numel=[f["local_shard_numel"] for f in facts],
            peak_memory_bytes=[f["peak_memory_bytes"] for f in facts],
            losses=losses, initial_loss=losses[0], final_loss=losses[-1],
            resumed_from_step=resumed_from, checkpoints=saved, steps=cfg["max_steps"],
            timed_steps=timed_steps, timed_seconds=elapsed, first_step_seconds=first_step_s,
            tokens_per_step=tokens_per_step, tokens_per_s=tokens_per_s, tokens_per_s_per_gpu=tokens_per_s_per_gpu,
            flops_per_token=flops_token, flop_formula=FLOP_FORMULA, peak_flops_per_gpu=peak,
            mfu=tokens_per_s_per_gpu * flops_token / peak if (tokens_per_s_per_gpu and peak) else None,
            config=cfg)
        print(f"done: final loss {losses[-1]:.4f}; metrics in {metrics}", flush=True)
        if tokens_per_s:
            mfu = json.loads(metrics.read_text())["mfu"]
            print(f"throughput {tokens_per_s:,.0f} tokens/s ({tokens_per_s_per_gpu:,.0f} per GPU)"
                  + (f", MFU {mfu:.1%}" if mfu else ""), flush=True)


if __name__ == "__main__":
    main()
