"""FSDP2 fine-tune of Qwen3.8-27B (or any Qwen3.5, Qwen3 or Llama-style causal LM) on chat data, one torchrun agent
per node.

    torchrun --nnodes=N --nproc-per-node=G --rdzv-backend=c10d --rdzv-endpoint=HOST:29500 --rdzv-id=JOB \
        train.py [--config my.yaml] [--key value ...]

Loading: rank 0 reads the checkpoint once, in bf16, into host memory; every rank builds the model on the meta
device, shards it, and receives its shard of rank 0's weights in fp32 (the master weights exist only sharded).
FSDP2: `fully_shard` on every decoder layer, then on the root (embeddings, final norm, lm_head), with
MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32): compute in bf16, fp32 master weights and
gradient reduction. Data: multi-turn conversations (`messages`) through the model's chat template, the loss on the
assistant's tokens only (`{% generation %}` marks: TRL's training copy of the template where the model's has none).
Sequence packing: conversations are concatenated into rows of max_length tokens and their position_ids restart at 0
for each one; with attention_mask=None transformers (>= 5) reads the restarts and builds a document mask: a
FlexAttention BlockMask (flex_attention, the default on GPUs: blocks of other documents are skipped, never computed)
or a dense block-diagonal one (sdpa, on CPUs). Qwen3.5's Gated DeltaNet layers ignore position_ids: linear_attention.py
gives their conv and recurrent state the sample boundaries (cu_seq_lens) and picks their kernels
(flash-linear-attention + causal-conv1d when installed and correct, else PyTorch).
Non-reentrant activation checkpointing, fused AdamW on GPU, torch.compile per decoder layer on GPUs, a distributed
checkpoint (torch.distributed.checkpoint) every `save_steps` steps (nbhelpers.training.checkpoints: sealed, verified on
resume), resumed automatically; the final model saved in bf16, gathered one tensor at a time.
Parameters, the loss and the final model go to MLflow. `synthetic_data` + `random_init` turn it into
the throughput benchmark (see README.md).
"""
from __future__ import annotations

import math
import random
import resource
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp  # noqa: F401  (the recipe's tests reach DCP through it)
import torch.nn.functional as F
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor, distribute_tensor
from tqdm import tqdm
from transformers import AttentionInterface, AttentionMaskInterface, AutoConfig, AutoModelForCausalLM, AutoTokenizer
from transformers.integrations.flex_attention import flex_attention_forward
from transformers.masking_utils import flex_attention_mask
from trl.chat_template_utils import get_training_chat_template

from nbhelpers.planner.flops import FLOP_FORMULA, peak_flops
from nbhelpers.training import checkpoints
from nbhelpers.training.activation_checkpointing import enable_checkpointing
from nbhelpers.training.metrics import peak_memory_bytes, write_metrics
from nbhelpers.training.step_times import StepTimes

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # recipes/: recipe_common.py, what the recipes share
sys.path.insert(0, str(HERE))  # linear_attention.py, also when this file is imported from elsewhere
from linear_attention import INSTALLED, has_linear_attention, install, packed_kwargs, select_kernels  # noqa: E402
from recipe_common import (Resumed, checkpoint_dir_to_use, gather_rank_facts, load_rows, log_causal_lm,  # noqa: E402
                           model_sizes, parse_settings, resume, save_checkpoint, torchrun_job)

RECIPE = "fsdp2_qwen3_multinode"
DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16}


@dataclass
class Settings:
    """config.yaml's keys, each also a flag (`--max_steps 10`): their types here, their values and meanings there."""
    model_name_or_path: str
    dataset_name: str
    dataset_train_split: str
    output_dir: str
    attn_implementation: str | None
    max_length: int
    per_device_train_batch_size: int
    gradient_accumulation_steps: int
    max_steps: int
    learning_rate: float
    min_lr_ratio: float
    warmup_steps: int
    weight_decay: float
    max_grad_norm: float
    param_dtype: str
    reduce_dtype: str
    reshard_after_forward: bool
    gradient_checkpointing: bool
    torch_compile: bool | None
    linear_attention_kernels: str
    save_steps: int
    save_total_limit: int
    resume_from_checkpoint: bool
    save_final_model: bool
    logging_steps: int
    seed: int
    ddp_timeout: int
    timing_warmup_steps: int
    synthetic_data: bool
    random_init: bool
    peak_tflops: float | None
    mlflow_tracking_uri: str | None


def main():
    args = parse_settings(Settings, HERE, __doc__.split("\n")[0])
    checkpoint_dir = checkpoint_dir_to_use(args)  # a fresh run over an earlier run's checkpoints stops here
    with torchrun_job(RECIPE, args) as (device, tracking):  # process group, seed, lost-node guard, MLflow on rank 0
        settle_defaults(args, device)
        host_before = host_peak_bytes()
        model, weights = build_model(args, device)
        sizes = model_sizes(model, args.max_length)  # counted before sharding
        shard_model(model, args, device)
        load_weights(model, weights, device)
        del weights  # rank 0's bf16 copy: from here on each rank holds its shard only
        host_load = host_peak_bytes() - host_before
        optimizer = torch.optim.AdamW(model.parameters(), lr=args.learning_rate, weight_decay=args.weight_decay,
                                      betas=(0.9, 0.95), fused=device.type == "cuda")
        resumed = resume(model, optimizer, checkpoint_dir) if args.resume_from_checkpoint else Resumed()
        batches = load_data(args, model.config.vocab_size, device, skip=resumed.step * args.gradient_accumulation_steps)
        run = train(model, optimizer, batches, args, resumed, checkpoint_dir, device, tracking)
        if args.save_final_model:
            save_final_model(model, args, tracking)
        report(args, model, sizes, resumed, run, device, tracking, host_load)


# --------------------------------------------------------------------------------------------------
# Model: built on the meta device, sharded, then filled with rank 0's weights (or built at random for the benchmark)
# --------------------------------------------------------------------------------------------------
def settle_defaults(args, device) -> None:
    """`null` settings that depend on the machine: on GPUs FlexAttention (packed rows as a document mask whose other
    documents' blocks are skipped) and torch.compile per layer; on CPUs sdpa (flex would compile for the CPU) and eager."""
    on_gpu = device.type == "cuda"
    if args.attn_implementation is None:
        args.attn_implementation = "flex_attention" if on_gpu else "sdpa"
    if args.torch_compile is None:
        args.torch_compile = on_gpu


# transformers 5.17 refuses flex_attention for Qwen3.5 (its model class does not declare _supports_flex_attn: the flag
# guards generation with its hybrid cache); for training its gated attention is plain GQA, so transformers' own flex
# attention and BlockMask builder are registered under a name of their own, which that check does not know.
FLEX = "flex_for_training"  # without "flex_attention" in it, which the check matches
AttentionInterface.register(FLEX, flex_attention_forward)
AttentionMaskInterface.register(FLEX, flex_attention_mask)


def build_model(args, device):
    """The architecture on the meta device (no memory), and rank 0's copy of the checkpoint's weights: read once, in
    bf16, into its host memory (the other ranks get None). fp32 master weights are made after sharding (load_weights),
    so no rank ever holds the whole model in fp32. `random_init` instead builds random fp32 weights directly on the
    GPU (the single-GPU benchmark: a config-only stand-in is enough)."""
    config = AutoConfig.from_pretrained(args.model_name_or_path)
    attention = FLEX if args.attn_implementation == "flex_attention" else args.attn_implementation
    weights = None
    with torch.device(device if args.random_init else "meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation=attention)
    if not args.random_init and dist.get_rank() == 0:
        loaded = AutoModelForCausalLM.from_pretrained(args.model_name_or_path, dtype=torch.bfloat16)
        weights = {**dict(loaded.named_parameters()), **dict(loaded.named_buffers())}  # buffers: rotary tables
    model.config.use_cache = False
    if args.linear_attention_kernels not in ("auto", "torch"):
        raise SystemExit(f"linear_attention_kernels must be auto or torch, not {args.linear_attention_kernels!r}")
    if has_linear_attention(model.config):  # Qwen3.5: Gated DeltaNet kernels that keep packed samples apart
        if dist.get_rank() == 0 and args.linear_attention_kernels == "auto" and device.type == "cuda":
            print("checking the fast Gated DeltaNet kernels against the PyTorch reference at this run's shapes (the "
                  "first time on a machine, Triton autotunes them: several minutes)", flush=True)
        kernels = select_kernels(device, fast=args.linear_attention_kernels == "auto", config=model.config,
                                 max_length=args.max_length)
        install(kernels)
        if dist.get_rank() == 0:
            print(kernels.describe(), flush=True)
    if args.gradient_checkpointing:
        enable_checkpointing(model, use_reentrant=False)
    return model, weights


def shard_model(model, args, device) -> None:
    """FSDP2: one FSDP unit per decoder layer (its all-gather overlaps the previous layer's compute), then the root
    for what is left; each rank then allocates its shard only (empty until load_weights)."""
    mp_policy = MixedPrecisionPolicy(param_dtype=DTYPES[args.param_dtype], reduce_dtype=DTYPES[args.reduce_dtype])
    for layer in model.model.layers:
        if args.torch_compile:  # the layer's forward only: FSDP's hooks stay eager; one graph serves every layer
            layer.forward = torch.compile(layer.forward)
        fully_shard(layer, mp_policy=mp_policy, reshard_after_forward=args.reshard_after_forward)
    fully_shard(model, mp_policy=mp_policy, reshard_after_forward=args.reshard_after_forward)
    if model.device.type == "meta":
        model.to_empty(device=device)
    model.to(device)


@torch.no_grad()
def load_weights(model, weights: dict | None, device) -> None:
    """Rank 0's weights into every rank's shards, one tensor at a time: rank 0 sends each, every rank keeps its slice
    in the shard's dtype (fp32: the master weights). Buffers (rotary tables) are sent whole. Nothing to do for
    random_init (weights None on every rank)."""
    dtypes = [{name: t.dtype for name, t in weights.items()} if weights is not None else None]
    dist.broadcast_object_list(dtypes, src=0)  # the other ranks allocate what rank 0 sends
    if dtypes[0] is None:
        return
    for name, target in [*model.named_parameters(), *model.named_buffers()]:
        full = (weights[name].to(device) if weights is not None
                else torch.empty(target.shape, dtype=dtypes[0][name], device=device))
        if isinstance(target, DTensor):
            target.to_local().copy_(distribute_tensor(full, target.device_mesh, target.placements,
                                                      src_data_rank=0).to_local())
        else:
            dist.broadcast(full, src=0)
            target.copy_(full)


def host_peak_bytes() -> int:
    """This process's peak resident host memory so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def local_numel(model) -> int:
    """Elements of this rank's shards."""
    return sum(p.to_local().numel() for p in model.parameters())


# --------------------------------------------------------------------------------------------------
# Data
# --------------------------------------------------------------------------------------------------
def load_data(args, vocab_size: int, device, skip: int):
    """This rank's endless batches, with the first `skip` left out: a resumed run sees the same data order."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    if args.synthetic_data:
        return synthetic_batches(vocab_size, args.max_length, args.per_device_train_batch_size, device,
                                 args.seed + rank)
    tokenizer = AutoTokenizer.from_pretrained(args.model_name_or_path)
    template = get_training_chat_template(tokenizer)  # None: the model's own template marks the assistant already
    samples = [tokenize_chat(tokenizer, template, row["messages"], args.max_length)
               for row in load_rows(args.dataset_name, args.dataset_train_split)]
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    batches = packed_batches(samples, args.max_length, args.per_device_train_batch_size, pad_id, rank, world_size,
                             args.seed)
    for _ in range(skip):
        next(batches)
    return batches


def tokenize_chat(tokenizer, template: str | None, messages: list[dict], max_length: int) -> tuple[list, list]:
    """(input_ids, labels) of one conversation, already shifted (labels[i] is the token after input_ids[i]): -100
    except where the assistant wrote the next token (its replies and their end-of-turn token), cut to max_length."""
    chat = tokenizer.apply_chat_template(messages, chat_template=template, tokenize=True, return_dict=True,
                                         return_assistant_tokens_mask=True)
    ids, assistant = chat["input_ids"][: max_length + 1], chat["assistant_masks"][: max_length + 1]
    return ids[:-1], [token if mine else -100 for token, mine in zip(ids[1:], assistant[1:])]


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
            raise ValueError(f"{len(rows)} packed rows cannot give {world_size} ranks a batch of {batch_size}; use more "
                             "data, a smaller per_device_train_batch_size or a smaller max_length")
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


def learning_rate(step: int, args) -> float:
    """Linear warm-up over `warmup_steps`, then cosine decay to learning_rate * min_lr_ratio at max_steps."""
    if step < args.warmup_steps:
        return args.learning_rate * (step + 1) / args.warmup_steps
    progress = (step - args.warmup_steps) / max(1, args.max_steps - args.warmup_steps)
    floor = args.learning_rate * args.min_lr_ratio
    return floor + 0.5 * (args.learning_rate - floor) * (1 + math.cos(math.pi * min(1.0, progress)))


# --------------------------------------------------------------------------------------------------
# Training
# --------------------------------------------------------------------------------------------------
def train_step(model, optimizer, loss_fn, micro_batches: list[dict], device, max_grad_norm: float) -> torch.Tensor:
    """One optimizer step over the micro-batches; returns the mean loss per labelled token of all ranks (on device)."""
    world_size, hybrid = dist.get_world_size(), has_linear_attention(model.config)
    # Mean over every labelled token of the step on all ranks: FSDP averages gradients over ranks, so each rank
    # scales its summed loss by world_size / (labelled tokens everywhere).
    n_tokens = sum((mb["labels"] != -100).sum() for mb in micro_batches).to(device, torch.float32)
    dist.all_reduce(n_tokens)
    step_loss = torch.zeros((), device=device)
    for i, mb in enumerate(micro_batches):
        model.set_requires_gradient_sync(i == len(micro_batches) - 1)  # reduce-scatter once per step
        position_ids = mb["position_ids"].to(device) if mb["position_ids"] is not None else None
        samples = packed_kwargs(position_ids) if position_ids is not None and hybrid else {}  # for linear attention
        logits = model(input_ids=mb["input_ids"].to(device), position_ids=position_ids, **samples).logits
        loss_sum = loss_fn(logits, mb["labels"].to(device))
        (loss_sum * world_size / n_tokens).backward()
        step_loss += loss_sum.detach()
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    dist.all_reduce(step_loss)
    return step_loss / n_tokens


def train(model, optimizer, batches, args, resumed: Resumed, checkpoint_dir: Path, device, tracking) -> dict:
    """Steps resumed.step .. max_steps; a checkpoint every save_steps; the loss read back (a GPU sync) only when logged."""
    rank, on_gpu = dist.get_rank(), device.type == "cuda"
    loss_fn = torch.compile(cross_entropy_sum) if args.torch_compile else cross_entropy_sum
    nodes = len({f["node_rank"] for f in gather_rank_facts()})
    if rank == 0:
        print(f"{dist.get_world_size()} ranks on {nodes} node(s); {local_numel(model) / 1e6:.1f} M parameters on rank 0; "
              f"steps {resumed.step}..{args.max_steps}", flush=True)
    model.train()
    step_losses, saved = [], []  # this run's per-step loss tensors; the checkpoints it wrote
    timing_from = resumed.step + args.timing_warmup_steps  # steps before it warm up (and compile)
    timed_start, first_step_s = None, None
    step_times = StepTimes(model)  # each rank's wait for data and forward passes: the straggler report at the end
    for step in tqdm(range(resumed.step, args.max_steps), disable=rank != 0, desc="train", mininterval=5):
        if step == timing_from:
            if on_gpu:
                torch.cuda.synchronize()
            timed_start = time.perf_counter()
        step_started = time.perf_counter()
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, args)
        micro_batches = [next(batches) for _ in range(args.gradient_accumulation_steps)]
        step_losses.append(train_step(model, optimizer, loss_fn, micro_batches, device, args.max_grad_norm))
        step_times.step_done()
        if step == resumed.step:
            first_step_s = time.perf_counter() - step_started  # includes torch.compile
            checkpoints.check_resumed_loss(step_losses[0].item(), resumed.path)
        done = step + 1
        if done % args.logging_steps == 0 or done == args.max_steps:
            loss = step_losses[-1].item()
            if rank == 0:
                print(f"step {done} loss {loss:.4f} lr {learning_rate(step, args):.2e}", flush=True)
            if tracking:
                tracking.log_metrics({"loss": loss, "learning_rate": learning_rate(step, args)}, step=done)
        if args.save_steps and done % args.save_steps == 0 and done < args.max_steps:
            losses = resumed.losses + [x.item() for x in step_losses]
            saved.append(str(save_checkpoint(model, optimizer, done, losses, checkpoint_dir, args.save_total_limit)))
    step_times.close()  # rank 0 names a rank that held the others back, and why (a collective)
    if on_gpu:
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - timed_start if timed_start is not None else None
    return {"losses": resumed.losses + [x.item() for x in step_losses], "checkpoints": saved, "timed_seconds": elapsed,
            "timed_steps": args.max_steps - timing_from if elapsed else 0, "first_step_seconds": first_step_s}


def save_final_model(model, args, tracking) -> None:
    """The weights gathered one tensor at a time in the compute dtype (bf16: 54 GB for the 27B in rank 0's host
    memory, never the fp32 masters), saved with save_pretrained into output_dir/final_model the way
    nbhelpers.training.checkpoints writes (complete or absent), then logged to MLflow."""
    dtype, rank0, state = DTYPES[args.param_dtype], dist.get_rank() == 0, {}
    for name, tensor in model.state_dict().items():
        tensor = tensor.to(dtype) if tensor.is_floating_point() else tensor
        full = tensor.full_tensor() if isinstance(tensor, DTensor) else tensor  # a collective: every rank takes part
        if rank0:
            state[name] = full.cpu()
    model.config.dtype = dtype  # what the saved weights are (config.json)
    with checkpoints.saving(Path(args.output_dir) / "final_model") as folder:
        if rank0:
            model.save_pretrained(folder, state_dict=state)
            AutoTokenizer.from_pretrained(args.model_name_or_path).save_pretrained(folder)
    log_causal_lm(tracking, Path(args.output_dir) / "final_model")


def report(args, model, sizes: dict, resumed: Resumed, run: dict, device, tracking, host_load: int) -> None:
    """metrics.json (rank 0): losses, checkpoints, throughput and MFU, each rank's shard, peak GPU memory, and host
    memory (what loading the model added to the rank's peak, and the peak of the whole run)."""
    on_gpu, world_size = device.type == "cuda", dist.get_world_size()
    tokens_per_step = args.per_device_train_batch_size * args.max_length * args.gradient_accumulation_steps * world_size
    elapsed, timed_steps = run["timed_seconds"], run["timed_steps"]
    tokens_per_s = tokens_per_step * timed_steps / elapsed if elapsed and timed_steps else None
    tokens_per_s_per_gpu = tokens_per_s / world_size if tokens_per_s else None
    peak = peak_flops(device, args.peak_tflops * 1e12 if args.peak_tflops else None)
    mfu = tokens_per_s_per_gpu * sizes["flops_per_token"] / peak if (tokens_per_s_per_gpu and peak) else None
    facts = gather_rank_facts(local_shard_numel=local_numel(model),
                              peak_memory_bytes=peak_memory_bytes(device),
                              peak_reserved_bytes=torch.cuda.max_memory_reserved(device) if on_gpu else None,
                              device=torch.cuda.get_device_name(device) if on_gpu else "cpu",
                              host_memory_load_bytes=host_load, host_memory_peak_bytes=host_peak_bytes())
    if dist.get_rank() != 0:
        return
    losses = run["losses"]
    path = write_metrics(
        args.output_dir, recipe=RECIPE, model_name_or_path=args.model_name_or_path, world_size=world_size,
        nodes=len({f["node_rank"] for f in facts}), ranks=facts, **sizes,
        local_shard_numel=[f["local_shard_numel"] for f in facts], peak_memory_bytes=[f["peak_memory_bytes"] for f in facts],
        losses=losses, initial_loss=losses[0], final_loss=losses[-1], resumed_from_step=resumed.step if resumed.path else None,
        checkpoints=run["checkpoints"], steps=args.max_steps, timed_steps=timed_steps, timed_seconds=elapsed,
        first_step_seconds=run["first_step_seconds"], tokens_per_step=tokens_per_step, tokens_per_s=tokens_per_s,
        tokens_per_s_per_gpu=tokens_per_s_per_gpu, flop_formula=FLOP_FORMULA, peak_flops_per_gpu=peak, mfu=mfu,
        linear_attention_kernels=INSTALLED[-1].describe() if has_linear_attention(model.config) else None,
        config=vars(args))
    if tracking:
        tracking.log_metrics({k: v for k, v in {"final_loss": losses[-1], "tokens_per_s": tokens_per_s, "mfu": mfu}.items()
                              if v is not None})
    print(f"done: final loss {losses[-1]:.4f}; metrics in {path}", flush=True)
    if tokens_per_s:
        print(f"throughput {tokens_per_s:,.0f} tokens/s ({tokens_per_s_per_gpu:,.0f} per GPU)"
              + (f", MFU {mfu:.1%}" if mfu else ""), flush=True)


if __name__ == "__main__":
    main()
