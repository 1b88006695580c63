"""Full fine-tune of Llama-3.1-8B on alpaca-style data with FSDP (FullyShardedDataParallel), one node per agent.

    torchrun --nnodes=N --nproc-per-node=G --rdzv-backend=c10d --rdzv-endpoint=HOST:29500 --rdzv-id=JOB \
        train.py [--config my.yaml] [--key value ...]

FSDP: every LlamaDecoderLayer is one FSDP unit (transformer_auto_wrap_policy), FULL_SHARD (parameters,
gradients and optimizer state split over all ranks), bf16 MixedPrecision on GPU (fp32 master weights
and gradient reduction), use_orig_params=True (the optimizer sees the model's own parameters).
On GPUs rank 0 alone reads the checkpoint; the other ranks build the model on the meta device and
receive the weights from rank 0 as FSDP shards them (sync_module_states), so a node holds one CPU copy,
not one per GPU (`cpu_ram_efficient_loading`). Gradient checkpointing on every layer. At the end the full
state dict is gathered to rank 0's CPU (FullStateDictConfig(offload_to_cpu=True, rank0_only=True)), saved
with save_pretrained (complete or absent: nbhelpers.training.checkpoints) and logged to MLflow with the settings
and the loss curve. Every `save_steps` steps a distributed checkpoint (torch.distributed.checkpoint: each rank
writes its shards; nbhelpers.training.checkpoints seals it) goes to output_dir/checkpoints, and the same command again
resumes from the newest verified one, on the same data order.
"""
from __future__ import annotations

import functools
import math
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FullStateDictConfig, MixedPrecision, ShardingStrategy, StateDictType
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy
from tqdm import tqdm
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
from transformers.models.llama.modeling_llama import LlamaDecoderLayer

from nbhelpers.planner.flops import FLOP_FORMULA, peak_flops
from nbhelpers.training import checkpoints
from nbhelpers.training.activation_checkpointing import enable_checkpointing
from nbhelpers.training.metrics import peak_memory_bytes, write_metrics
from nbhelpers.training.step_times import StepTimes

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # recipes/: recipe_common.py, what the recipes share
from recipe_common import (Resumed, alpaca_prompt, checkpoint_dir_to_use, gather_rank_facts, load_rows,  # noqa: E402
                           log_causal_lm, model_sizes, parse_settings, resume, save_checkpoint,
                           tokenize_prompt_response, torchrun_job)

RECIPE = "fsdp_llama_3_1_8b_multinode"


@dataclass
class Settings:
    """config.yaml's keys, each also a flag (`--max_steps 10`): their types here, their values and meanings there."""
    model_name_or_path: str
    dataset_name: str
    output_dir: str
    max_length: int
    per_device_train_batch_size: int
    gradient_accumulation_steps: int
    num_train_epochs: int
    max_steps: int
    learning_rate: float
    warmup_steps: int
    weight_decay: float
    max_grad_norm: float
    bf16: bool
    gradient_checkpointing: bool
    cpu_ram_efficient_loading: bool
    logging_steps: int
    save_steps: int
    save_total_limit: int
    resume_from_checkpoint: bool
    seed: int
    ddp_timeout: int
    timing_warmup_steps: int
    peak_tflops: float | None
    mlflow_tracking_uri: str | None


def main():
    args = parse_settings(Settings, HERE, __doc__.split("\n")[0])
    checkpoint_dir = checkpoint_dir_to_use(args)  # a fresh run over an earlier run's checkpoints stops here
    with torchrun_job(RECIPE, args) as (device, tracking):  # process group, seed, lost-node guard, MLflow on rank 0
        model = build_model(args, device)
        sizes = model_sizes(model, args.max_length)  # at full length (batches are padded shorter), before sharding
        model = shard_model(model, args, device)
        optimizer = torch.optim.AdamW(model.parameters(), lr=args.learning_rate, weight_decay=args.weight_decay)
        resumed = resume(model, optimizer, checkpoint_dir) if args.resume_from_checkpoint else Resumed()
        tokenizer, samples = load_data(args)
        run = train(model, optimizer, tokenizer, samples, args, device, tracking, resumed, checkpoint_dir)
        save_final_model(model, tokenizer, args, tracking)
        report(args, model, sizes, run, device, tracking)


# --------------------------------------------------------------------------------------------------
# Model: read (by rank 0 alone on GPUs), then one FSDP unit per decoder layer
# --------------------------------------------------------------------------------------------------
def rank0_reads_alone(args, device) -> bool:
    """FSDP's broadcast of rank 0's weights (sync_module_states) needs GPUs: on CPUs every rank reads them."""
    return args.cpu_ram_efficient_loading and device.type == "cuda"


def build_model(args, device):
    """Rank 0 reads the weights in fp32 (FSDP keeps fp32 master shards); with `cpu_ram_efficient_loading` on GPUs
    the other ranks build the architecture only, on the meta device."""
    if dist.get_rank() == 0 or not rank0_reads_alone(args, device):
        model = AutoModelForCausalLM.from_pretrained(args.model_name_or_path, dtype=torch.float32)
    else:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(args.model_name_or_path),
                                                     dtype=torch.float32)
    model.config.use_cache = False
    if args.gradient_checkpointing:
        enable_checkpointing(model, use_reentrant=False)
    return model


def shard_model(model, args, device) -> FSDP:
    """FSDP: one unit per decoder layer, FULL_SHARD, bf16 compute on GPU."""
    broadcast = rank0_reads_alone(args, device)
    mixed_precision = None
    if device.type == "cuda" and args.bf16:
        mixed_precision = MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.float32,
                                         buffer_dtype=torch.float32)
    return FSDP(
        model,
        auto_wrap_policy=functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={LlamaDecoderLayer}),
        sharding_strategy=ShardingStrategy.FULL_SHARD,
        mixed_precision=mixed_precision,
        device_id=device,  # a GPU, or the CPU for the CPU tests (gloo)
        use_orig_params=True,
        limit_all_gathers=True,
        sync_module_states=broadcast,  # rank 0's weights (and buffers) to every rank, unit by unit
        param_init_fn=(lambda module: module.to_empty(device=device, recurse=False))
        if broadcast and dist.get_rank() != 0 else None,
    )


# --------------------------------------------------------------------------------------------------
# Data: alpaca rows -> (input_ids, labels), this rank's share of each shuffled epoch, padded per batch
# --------------------------------------------------------------------------------------------------
def load_data(args):
    tokenizer = AutoTokenizer.from_pretrained(args.model_name_or_path)
    samples = [tokenize_prompt_response(tokenizer, alpaca_prompt(row), row["output"], args.max_length)
               for row in load_rows(args.dataset_name, "train")]
    return tokenizer, samples


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


# --------------------------------------------------------------------------------------------------
# Training
# --------------------------------------------------------------------------------------------------
def learning_rate(step: int, total: int, args) -> float:
    """Linear warm-up over `warmup_steps`, then cosine decay to 0 at `total` steps."""
    if step < args.warmup_steps:
        return args.learning_rate * (step + 1) / args.warmup_steps
    progress = (step - args.warmup_steps) / max(1, total - args.warmup_steps)
    return args.learning_rate * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


def train_step(model, optimizer, micro_batches: list[dict], device, max_grad_norm: float) -> torch.Tensor:
    """One optimizer step over the micro-batches; returns the mean loss per labelled token of all ranks."""
    world_size = dist.get_world_size()
    # Mean over the step's labelled tokens on all ranks (FSDP averages gradients over ranks).
    n_tokens = sum((mb["labels"] != -100).sum() for mb in micro_batches).to(device, torch.float32)
    dist.all_reduce(n_tokens)
    step_loss = torch.zeros((), device=device)
    for i, mb in enumerate(micro_batches):
        # no_sync: accumulate locally, reduce-scatter only on the last micro-batch
        with model.no_sync() if i < len(micro_batches) - 1 else torch.enable_grad():
            logits = model(input_ids=mb["input_ids"], attention_mask=mb["attention_mask"]).logits
            loss_sum = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), mb["labels"].flatten(),
                                                         ignore_index=-100, reduction="sum")
            (loss_sum * world_size / n_tokens).backward()
        step_loss += loss_sum.detach()
    model.clip_grad_norm_(max_grad_norm)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    dist.all_reduce(step_loss)
    return step_loss / n_tokens


def train(model, optimizer, tokenizer, samples, args, device, tracking, resumed: Resumed, checkpoint_dir: Path) -> dict:
    """`max_steps` optimizer steps (0: `num_train_epochs` epochs) from `resumed.step` on; a checkpoint every
    `save_steps`; tokens/s timed after `timing_warmup_steps`."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    batch_size, accumulation = args.per_device_train_batch_size, args.gradient_accumulation_steps
    total_steps = args.max_steps or args.num_train_epochs * (len(samples) // world_size // batch_size // accumulation)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    data = batches(samples, batch_size, pad_id, rank, world_size, args.seed)
    for _ in range(resumed.step * accumulation):  # a resumed run goes on with the batches it had not seen
        next(data)
    nodes = len({f["node_rank"] for f in gather_rank_facts()})
    if rank == 0:
        print(f"{world_size} ranks on {nodes} node(s); steps {resumed.step}..{total_steps} of {batch_size} x "
              f"{accumulation} x {world_size} samples", flush=True)
    model.train()
    losses, tokens, timed_start = list(resumed.losses), torch.zeros(2, dtype=torch.float64), None  # labelled, all
    step_times = StepTimes(model)  # each rank's wait for data and forward passes: the straggler report at the end
    saved = []
    for step in tqdm(range(resumed.step, total_steps), disable=rank != 0, desc="train", mininterval=5):
        if step == resumed.step + args.timing_warmup_steps:
            if device.type == "cuda":
                torch.cuda.synchronize()
            timed_start, tokens = time.perf_counter(), torch.zeros(2, dtype=torch.float64)
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, total_steps, args)
        micro_batches = [{k: v.to(device) for k, v in next(data).items()} for _ in range(accumulation)]
        losses.append(train_step(model, optimizer, micro_batches, device, args.max_grad_norm).item())
        step_times.step_done()
        if step == resumed.step:
            checkpoints.check_resumed_loss(losses[-1], resumed.path)
        tokens += torch.tensor([sum(float((mb["labels"] != -100).sum()) for mb in micro_batches),
                                sum(float(mb["attention_mask"].sum()) for mb in micro_batches)], dtype=torch.float64)
        if (step + 1) % args.logging_steps == 0 or step + 1 == total_steps:
            if rank == 0:
                print(f"step {step + 1} loss {losses[-1]:.4f}", flush=True)
            if tracking:
                tracking.log_metrics({"loss": losses[-1], "learning_rate": learning_rate(step, total_steps, args)},
                                     step=step + 1)
        if args.save_steps and (step + 1) % args.save_steps == 0 and step + 1 < total_steps:
            saved.append(str(save_checkpoint(model, optimizer, step + 1, losses, checkpoint_dir, args.save_total_limit)))
    step_times.close()  # rank 0 names a rank that held the others back, and why (a collective)
    if device.type == "cuda":
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - timed_start if timed_start else None
    tokens = tokens.to(device)
    dist.all_reduce(tokens)
    return {"losses": losses, "steps": total_steps, "timed_seconds": elapsed, "label_tokens": tokens[0].item(),
            "tokens": tokens[1].item(), "checkpoints": saved, "resumed_from_step": resumed.step if resumed.path else None}


def save_final_model(model, tokenizer, args, tracking) -> None:
    """The full state dict, gathered to rank 0's CPU one unit at a time, saved by rank 0 as a normal HF checkpoint
    into output_dir/final_model (complete or absent: nbhelpers.training.checkpoints), then logged to MLflow."""
    with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT,
                              FullStateDictConfig(offload_to_cpu=True, rank0_only=True)):
        full_state = model.state_dict()
    with checkpoints.saving(Path(args.output_dir) / "final_model") as folder:
        if dist.get_rank() == 0:
            model.module.save_pretrained(folder, state_dict=full_state)
            tokenizer.save_pretrained(folder)
    log_causal_lm(tracking, Path(args.output_dir) / "final_model")


def report(args, model, sizes: dict, run: dict, device, tracking) -> None:
    """metrics.json (rank 0): the loss curve, tokens/s and MFU, each rank's shard size and peak memory."""
    on_gpu, world_size, elapsed = device.type == "cuda", dist.get_world_size(), run["timed_seconds"]
    peak = peak_flops(device, args.peak_tflops * 1e12 if args.peak_tflops else None)
    # use_orig_params: each original parameter is a view of this rank's shard (size 0 where it holds none of it)
    facts = gather_rank_facts(local_shard_numel=sum(p.numel() for p in model.parameters()),
                              peak_memory_bytes=peak_memory_bytes(device),
                              device=torch.cuda.get_device_name(device) if on_gpu else "cpu")
    if dist.get_rank() != 0:
        return
    losses, final_model = run["losses"], Path(args.output_dir) / "final_model"
    tokens_per_s = run["tokens"] / elapsed if elapsed else None
    tokens_per_s_per_gpu = tokens_per_s / world_size if tokens_per_s else None
    mfu = tokens_per_s_per_gpu * sizes["flops_per_token"] / peak if (tokens_per_s_per_gpu and peak) else None
    path = write_metrics(
        args.output_dir, recipe=RECIPE, model_name_or_path=args.model_name_or_path, world_size=world_size,
        nodes=len({f["node_rank"] for f in facts}), ranks=facts, **sizes,
        local_shard_numel=[f["local_shard_numel"] for f in facts], peak_memory_bytes=[f["peak_memory_bytes"] for f in facts],
        losses=losses, initial_loss=losses[0], final_loss=losses[-1], steps=run["steps"], timed_seconds=elapsed,
        tokens_per_s=tokens_per_s, tokens_per_s_per_gpu=tokens_per_s_per_gpu,
        label_tokens_per_s=run["label_tokens"] / elapsed if elapsed else None,
        flop_formula=FLOP_FORMULA + "; S = max_length although padded batches are shorter", peak_flops_per_gpu=peak,
        mfu=mfu, saved_model=str(final_model), checkpoints=run["checkpoints"],
        resumed_from_step=run["resumed_from_step"], config=vars(args))
    if tracking:
        tracking.log_metrics({k: v for k, v in {"final_loss": losses[-1], "tokens_per_s": tokens_per_s, "mfu": mfu}.items()
                              if v is not None})
    print(f"done: final loss {losses[-1]:.4f}; model in {final_model}; metrics in {path}", flush=True)


if __name__ == "__main__":
    main()
