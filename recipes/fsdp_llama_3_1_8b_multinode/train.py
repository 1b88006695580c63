"""Full fine-tune of Llama-3.1-8B on alpaca-style data with FSDP (FullyShardedDataParallel), one node per agent.

    torchrun --nnodes=N --nproc-per-node=G --rdzv-backend=c10d --rdzv-endpoint=HOST:29500 --rdzv-id=JOB \
        train.py --config config.yaml [--key value ...]

FSDP: every LlamaDecoderLayer is one FSDP unit (transformer_auto_wrap_policy), FULL_SHARD (parameters,
gradients and optimizer state split over all ranks), bf16 MixedPrecision on GPU (fp32 master weights
and gradient reduction), use_orig_params=True (the optimizer sees the model's own parameters).
On GPUs rank 0 alone reads the checkpoint; the other ranks build the model on the meta device and
receive the weights from rank 0 as FSDP shards them (sync_module_states), so a node holds one CPU copy,
not one per GPU (`low_cpu_memory`). Gradient checkpointing on every layer. At the end the full state
dict is gathered to rank 0's CPU (FullStateDictConfig(offload_to_cpu=True, rank0_only=True)) and saved
with save_pretrained.
"""
from __future__ import annotations

import functools
import math
import random
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FullStateDictConfig, MixedPrecision, ShardingStrategy, StateDictType
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy
from tqdm import tqdm
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
from transformers.models.llama.modeling_llama import LlamaDecoderLayer

from nbhelpers.metrics import peak_memory_bytes, write_metrics
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # recipes/: recipe_common.py, what the recipes share
from recipe_common import (FLOP_FORMULA, alpaca_prompt, flops_per_token, gather_rank_facts, init_distributed,  # noqa: E402
                           load_rows, matmul_parameters, parse_args, peak_flops, shutdown, stop_clearly_if_a_peer_is_lost,
                           tokenize_prompt_response)


def batches(samples, batch_size, pad_id, rank, world_size, seed):
    """Endless batches for this rank (a DistributedSampler's split), each padded to its longest sample."""
    epoch = 0
    while True:
        order = list(range(len(samples)))
        random.Random(seed + epoch).shuffle(order)
        per_rank = len(order) // world_size // batch_size * batch_size
        mine = order[rank::world_size][:per_rank]
        for start in range(0, per_rank, batch_size):
            chunk = [samples[i] for i in mine[start:start + batch_size]]
            longest = max(len(ids) for ids, _ in chunk)
            yield {
                "input_ids": torch.tensor([ids + [pad_id] * (longest - len(ids)) for ids, _ in chunk]),
                "labels": torch.tensor([labels + [-100] * (longest - len(labels)) for _, labels in chunk]),
                "attention_mask": torch.tensor([[1] * len(ids) + [0] * (longest - len(ids)) for ids, _ in chunk]),
            }
        epoch += 1


def learning_rate(step: int, total: int, cfg: dict) -> float:
    if step < cfg["warmup_steps"]:
        return cfg["lr"] * (step + 1) / cfg["warmup_steps"]
    progress = (step - cfg["warmup_steps"]) / max(1, total - cfg["warmup_steps"])
    return cfg["lr"] * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


def main():
    cfg = vars(parse_args(HERE, __doc__.split("\n")[0]))
    device = init_distributed(cfg["timeout_s"])
    torch.manual_seed(cfg["seed"])
    with stop_clearly_if_a_peer_is_lost(cfg["timeout_s"]):
        train(cfg, device, dist.get_rank(), dist.get_world_size(), Path(cfg["output_dir"]))
    shutdown()


def train(cfg, device, rank, world_size, output_dir):
    on_gpu = device.type == "cuda"
    # Rank 0 reads the weights (fp32: FSDP keeps fp32 master shards); the others only the architecture.
    # FSDP's broadcast of rank 0's weights (sync_module_states) needs GPUs: on CPUs every rank reads them.
    broadcast_from_rank0 = cfg["low_cpu_memory"] and on_gpu
    if rank == 0 or not broadcast_from_rank0:
        model = AutoModelForCausalLM.from_pretrained(cfg["model_name"], dtype=torch.float32)
    else:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(cfg["model_name"]),
                                                     dtype=torch.float32)
    model.config.use_cache = False
    n_parameters = sum(p.numel() for p in model.parameters())
    n_matmul_parameters = matmul_parameters(model)
    flops_token = flops_per_token(model, cfg["seq_len"])  # at full length; tokens/s counts real tokens
    if cfg["gradient_checkpointing"]:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})

    # FSDP: one unit per decoder layer, FULL_SHARD, bf16 compute on GPU.
    mixed_precision = None
    if on_gpu and cfg["mixed_precision"] == "bf16":
        mixed_precision = MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.float32,
                                         buffer_dtype=torch.float32)
    model = FSDP(
        model,
        auto_wrap_policy=functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={LlamaDecoderLayer}),
        sharding_strategy=ShardingStrategy.FULL_SHARD,
        mixed_precision=mixed_precision,
        device_id=device,  # a GPU, or the CPU for the CPU tests (gloo)
        use_orig_params=True,
        limit_all_gathers=True,
        sync_module_states=broadcast_from_rank0,  # rank 0's weights (and buffers) to every rank, unit by unit
        param_init_fn=(lambda module: module.to_empty(device=device, recurse=False))
        if broadcast_from_rank0 and rank != 0 else None,
    )
    # use_orig_params: each original parameter is a view of this rank's shard (size 0 where it holds none of it).
    local_numel = sum(p.numel() for p in model.parameters())
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg["lr"], weight_decay=cfg["weight_decay"])

    tokenizer = AutoTokenizer.from_pretrained(cfg["model_name"])
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    rows = load_rows(cfg["dataset"], "train")
    samples = [tokenize_prompt_response(tokenizer, alpaca_prompt(row), row["output"], cfg["seq_len"]) for row in rows]
    steps_per_epoch = len(samples) // world_size // cfg["batch_size"] // cfg["grad_accum"]
    total_steps = cfg["max_steps"] or cfg["epochs"] * steps_per_epoch
    data = batches(samples, cfg["batch_size"], pad_id, rank, world_size, cfg["seed"])
    nodes = len({f["node_rank"] for f in gather_rank_facts()})
    if rank == 0:
        print(f"{world_size} ranks on {nodes} node(s); {n_parameters / 1e6:.1f} M parameters, "
              f"{local_numel / 1e6:.2f} M on rank 0; {total_steps} steps of "
              f"{cfg['batch_size']} x {cfg['grad_accum']} x {world_size} samples", flush=True)

    model.train()
    losses, label_tokens, seen_tokens = [], 0, 0
    timed_start = None
    progress = tqdm(range(total_steps), disable=rank != 0, desc="train", mininterval=5)
    for step in progress:
        if step == cfg["timing_warmup_steps"]:
            if on_gpu:
                torch.cuda.synchronize()
            timed_start, label_tokens, seen_tokens = time.perf_counter(), 0, 0
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, total_steps, cfg)
        micro_batches = [next(data) for _ in range(cfg["grad_accum"])]
        # Mean over the step's labelled tokens on all ranks (FSDP averages gradients over ranks).
        n_tokens = sum((mb["labels"] != -100).sum() for mb in micro_batches).to(device, torch.float32)
        dist.all_reduce(n_tokens)
        step_loss = torch.zeros((), device=device)
        for i, mb in enumerate(micro_batches):
            mb = {key: value.to(device) for key, value in mb.items()}
            # no_sync: accumulate locally, reduce-scatter only on the last micro-batch
            with model.no_sync() if i < len(micro_batches) - 1 else torch.enable_grad():
                logits = model(input_ids=mb["input_ids"], attention_mask=mb["attention_mask"]).logits
                loss_sum = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), mb["labels"].flatten(),
                                                             ignore_index=-100, reduction="sum")
                (loss_sum * world_size / n_tokens).backward()
            step_loss += loss_sum.detach()
            label_tokens += int((mb["labels"] != -100).sum())
            seen_tokens += int(mb["attention_mask"].sum())
        model.clip_grad_norm_(cfg["max_grad_norm"])
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        dist.all_reduce(step_loss)
        losses.append((step_loss / n_tokens).item())
        progress.set_postfix(loss=f"{losses[-1]:.4f}")
        if rank == 0 and ((step + 1) % cfg["log_every"] == 0 or step + 1 == total_steps):
            print(f"step {step + 1} loss {losses[-1]:.4f}", flush=True)
    if on_gpu:
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - timed_start if timed_start else None

    # The full state dict, gathered to rank 0's CPU one unit at a time, saved as a normal HF checkpoint.
    save_config = FullStateDictConfig(offload_to_cpu=True, rank0_only=True)
    with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT, save_config):
        full_state = model.state_dict()
    if rank == 0:
        model.module.save_pretrained(output_dir / "final_model", state_dict=full_state)
        tokenizer.save_pretrained(output_dir / "final_model")
    dist.barrier()

    totals = torch.tensor([label_tokens, seen_tokens], device=device, dtype=torch.float64)
    dist.all_reduce(totals)
    peak = peak_flops(device, cfg["peak_tflops"] * 1e12 if cfg["peak_tflops"] else None)
    facts = gather_rank_facts(local_shard_numel=local_numel, peak_memory_bytes=peak_memory_bytes(device),
                              device=torch.cuda.get_device_name(device) if on_gpu else "cpu")
    if rank == 0:
        tokens_per_s = totals[1].item() / elapsed if elapsed else None
        tokens_per_s_per_gpu = tokens_per_s / world_size if tokens_per_s else None
        path = write_metrics(
            output_dir, recipe="fsdp_llama_3_1_8b_multinode", model_name=cfg["model_name"],
            world_size=world_size, nodes=len({f["node_rank"] for f in facts}), ranks=facts,
            parameters=n_parameters, matmul_parameters=n_matmul_parameters,
            local_shard_numel=[f["local_shard_numel"] for f in facts],
            peak_memory_bytes=[f["peak_memory_bytes"] for f in facts],
            losses=losses, initial_loss=losses[0], final_loss=losses[-1], steps=total_steps,
            timed_seconds=elapsed, tokens_per_s=tokens_per_s, tokens_per_s_per_gpu=tokens_per_s_per_gpu,
            label_tokens_per_s=totals[0].item() / elapsed if elapsed else None,
            flops_per_token=flops_token,
            flop_formula=FLOP_FORMULA + "; S = seq_len although padded batches are shorter",
            peak_flops_per_gpu=peak,
            mfu=tokens_per_s_per_gpu * flops_token / peak if (tokens_per_s_per_gpu and peak) else None,
            saved_model=str(output_dir / "final_model"), config=cfg)
        print(f"done: final loss {losses[-1]:.4f}; model in {output_dir / 'final_model'}; metrics in {path}",
              flush=True)


if __name__ == "__main__":
    main()
