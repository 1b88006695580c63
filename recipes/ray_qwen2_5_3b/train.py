"""Full fine-tune of Qwen2.5-3B on alpaca-style instructions with Ray Train (DDP, bf16 autocast on GPUs).

    python recipes/ray_qwen2_5_3b/train.py --num-workers 2                                  # one node
    RAY_ADDRESS=HEAD:6379 python recipes/ray_qwen2_5_3b/train.py --num-workers 16 \\
        --storage-path /shared/ray_results                                                  # a cluster

Defaults are in config.yaml (Qwen/Qwen2.5-3B, tatsu-lab/alpaca, seq 1024, batch 4 per worker, AdamW 2e-5,
clip 1.0, 100 steps); any flag overrides them. `--model` takes a hub id or a local folder, `--data` a hub
dataset id or a local JSON/JSONL file (or a folder with train.jsonl) with instruction/input/output.

Examples are rendered with the Alpaca prompt, the loss is on the response tokens only, and examples are
packed into full `seq_len` blocks (so tokens/s counts real tokens). Weights stay fp32 (the optimizer's
master copy) and the forward/backward runs under bf16 autocast on GPUs: a pure-bf16 AdamW would drop
updates of size 2e-5. Every `log_every` steps the workers report the mean loss and tokens/s through
`ray.train.report`; at the end rank 0 reports the model (bf16 safetensors) and tokenizer as the run's
checkpoint, which Ray Train stores under the storage path. The driver writes OUTPUT_DIR/metrics.json.
"""
from __future__ import annotations

import argparse
import os
import random
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import yaml
from datasets import load_dataset
from transformers import AutoModelForCausalLM, AutoTokenizer

import ray
import ray.train
import ray.train.torch
from ray.train import Checkpoint, RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer

HERE = Path(__file__).resolve().parent
PROMPT_WITH_INPUT = (
    "Below is an instruction that describes a task, paired with an input that provides further context. "
    "Write a response that appropriately completes the request.\n\n"
    "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n"
)
PROMPT_WITHOUT_INPUT = (
    "Below is an instruction that describes a task. Write a response that appropriately completes the request.\n\n"
    "### Instruction:\n{instruction}\n\n### Response:\n"
)


def load_examples(data: str):
    """A hub dataset id, a JSON/JSONL file, or a folder holding train.jsonl -> the train split."""
    if os.path.isdir(data):
        data = os.path.join(data, "train.jsonl")
    if os.path.exists(data):
        return load_dataset("json", data_files=data, split="train")
    return load_dataset(data, split="train")


def packed_blocks(examples, tokenizer, seq_len: int, blocks_needed: int, seed: int) -> list[dict]:
    """Tokenize shuffled examples (prompt tokens masked out of the labels) and pack them into blocks of
    exactly `seq_len` tokens, until `blocks_needed` blocks exist (or the data runs out)."""
    order = list(range(len(examples)))
    random.Random(seed).shuffle(order)
    ids, labels, blocks = [], [], []
    for index in order:
        example = examples[index]
        template = PROMPT_WITH_INPUT if example.get("input") else PROMPT_WITHOUT_INPUT
        prompt = tokenizer(template.format(**example), add_special_tokens=False)["input_ids"]
        response = tokenizer(example["output"], add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        ids += prompt + response
        labels += [-100] * len(prompt) + response
        while len(ids) >= seq_len:
            blocks.append({"input_ids": torch.tensor(ids[:seq_len]), "labels": torch.tensor(labels[:seq_len])})
            ids, labels = ids[seq_len:], labels[seq_len:]
        if len(blocks) >= blocks_needed:
            break
    if not blocks:
        raise ValueError(f"the data holds fewer than seq_len={seq_len} tokens")
    return blocks


def train_loop_per_worker(config: dict) -> list[dict]:
    """What every Ray Train worker runs: plain PyTorch + transformers, with Ray's DDP/sampler helpers."""
    context = ray.train.get_context()
    rank, world_size = context.get_world_rank(), context.get_world_size()
    device = ray.train.torch.get_device()
    bf16 = config["bf16"] and device.type == "cuda"
    torch.manual_seed(config["seed"])

    tokenizer = AutoTokenizer.from_pretrained(config["model"])
    blocks_needed = config["max_steps"] * config["batch_size"] * world_size
    blocks = packed_blocks(load_examples(config["data"]), tokenizer, config["seq_len"], blocks_needed, config["seed"])
    loader = ray.train.torch.prepare_data_loader(  # Ray: adds a DistributedSampler, moves batches to the device
        torch.utils.data.DataLoader(blocks, batch_size=config["batch_size"], shuffle=True, drop_last=True))

    model = AutoModelForCausalLM.from_pretrained(config["model"], dtype=torch.float32)  # fp32 master weights
    if config["gradient_checkpointing"]:
        model.gradient_checkpointing_enable()
    model = ray.train.torch.prepare_model(model)  # Ray: onto this worker's GPU, wrapped in DDP
    optimizer = torch.optim.AdamW(model.parameters(), lr=config["lr"], weight_decay=config["weight_decay"])

    history, step, epoch = [], 0, 0
    tokens_per_step = config["batch_size"] * config["seq_len"] * world_size
    timed_from, loss_sum = None, torch.zeros((), device=device)
    model.train()
    while step < config["max_steps"]:
        if world_size > 1:
            loader.sampler.set_epoch(epoch)
        for batch in loader:
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
                loss = model(input_ids=batch["input_ids"], labels=batch["labels"]).loss
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), config["grad_clip"])
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            loss_sum += loss.detach()
            if step == config["timing_warmup_steps"]:
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                timed_from = (step, time.perf_counter())
            if step % config["log_every"] == 0 or step == config["max_steps"]:
                steps_logged = step - (history[-1]["step"] if history else 0)
                if dist.is_initialized():
                    dist.all_reduce(loss_sum)  # the mean over every worker's batches
                tokens_per_s = None
                if timed_from and step > timed_from[0]:
                    if device.type == "cuda":
                        torch.cuda.synchronize(device)
                    tokens_per_s = (step - timed_from[0]) * tokens_per_step / (time.perf_counter() - timed_from[1])
                metrics = {"step": step, "loss": loss_sum.item() / steps_logged / world_size,
                           "grad_norm": grad_norm.item(), "tokens_per_s": tokens_per_s, "world_size": world_size}
                if device.type == "cuda":
                    metrics["peak_memory_bytes"] = torch.cuda.max_memory_allocated(device)
                history.append(metrics)
                loss_sum.zero_()
                if rank == 0:
                    rate = f"{tokens_per_s:,.0f} tokens/s" if tokens_per_s else "warming up"
                    print(f"step {step}/{config['max_steps']}: loss {metrics['loss']:.4f}, {rate}", flush=True)
                ray.train.report(metrics)  # every worker reports: it is a barrier
            if step >= config["max_steps"]:
                break
        epoch += 1

    if config["save_model"]:
        with tempfile.TemporaryDirectory() as folder:
            checkpoint = None
            if rank == 0:
                unwrapped = model.module if world_size > 1 else model
                state = {k: v.to(torch.bfloat16) for k, v in unwrapped.state_dict().items()}
                unwrapped.save_pretrained(folder, state_dict=state)
                tokenizer.save_pretrained(folder)
                checkpoint = Checkpoint.from_directory(folder)
            ray.train.report(history[-1], checkpoint=checkpoint)
    return history


def parse_args(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default=str(HERE / "config.yaml"), help="YAML file of defaults")
    parser.add_argument("--model", help="hub id or local folder of a causal LM")
    parser.add_argument("--data", help="hub dataset id, JSON/JSONL file, or folder with train.jsonl")
    parser.add_argument("--num-workers", type=int, help="Ray Train workers: one GPU each (or CPU)")
    parser.add_argument("--use-gpu", action=argparse.BooleanOptionalAction, help="default: if the cluster has GPUs")
    parser.add_argument("--max-steps", type=int)
    parser.add_argument("--seq-len", type=int)
    parser.add_argument("--batch-size", type=int, help="per worker")
    parser.add_argument("--lr", type=float)
    parser.add_argument("--weight-decay", type=float)
    parser.add_argument("--grad-clip", type=float)
    parser.add_argument("--bf16", action=argparse.BooleanOptionalAction, help="bf16 autocast on GPUs")
    parser.add_argument("--gradient-checkpointing", action=argparse.BooleanOptionalAction)
    parser.add_argument("--log-every", type=int)
    parser.add_argument("--timing-warmup-steps", type=int, help="steps before tokens/s is timed")
    parser.add_argument("--save-model", action=argparse.BooleanOptionalAction, help="report the model as a checkpoint")
    parser.add_argument("--seed", type=int)
    parser.add_argument("--output-dir", help="metrics.json goes here")
    parser.add_argument("--storage-path", help="checkpoints (shared storage on a cluster); default OUTPUT_DIR/ray_results")
    parser.add_argument("--address", help="Ray cluster address; default RAY_ADDRESS, else a local Ray")
    args = parser.parse_args(argv)
    config = yaml.safe_load(Path(args.config).read_text())
    config.update({k: v for k, v in vars(args).items() if v is not None and k != "config"})
    for key in ("model", "data"):  # local paths become absolute: the workers may run elsewhere
        if os.path.exists(os.path.expanduser(config[key])):
            config[key] = os.path.abspath(os.path.expanduser(config[key]))
    config["output_dir"] = os.path.abspath(os.path.expanduser(config["output_dir"]))
    config["storage_path"] = config.get("storage_path") or os.path.join(config["output_dir"], "ray_results")
    return config


def main(argv=None) -> None:
    config = parse_args(argv)
    os.environ.setdefault("RAY_TRAIN_ENABLE_PRINT_PATCH", "0")  # worker prints reach us once, not twice
    ray.init(address=config.get("address"))
    use_gpu = config.get("use_gpu")
    if use_gpu is None:
        use_gpu = ray.cluster_resources().get("GPU", 0) > 0
    trainer = TorchTrainer(
        train_loop_per_worker,
        train_loop_config=config,
        scaling_config=ScalingConfig(num_workers=config["num_workers"], use_gpu=use_gpu),
        run_config=RunConfig(name=config["run_name"], storage_path=config["storage_path"]),
    )
    started = time.perf_counter()
    result = trainer.fit()
    wall_s = time.perf_counter() - started
    history = result.return_value  # rank 0's list of logged steps
    losses = [h["loss"] for h in history]
    timed = [h["tokens_per_s"] for h in history if h["tokens_per_s"]]
    from nbhelpers.metrics import write_metrics

    path = write_metrics(
        config["output_dir"],
        recipe="ray_qwen2_5_3b", model=config["model"], world_size=history[-1]["world_size"], use_gpu=use_gpu,
        seq_len=config["seq_len"], batch_size_per_worker=config["batch_size"], max_steps=config["max_steps"],
        history=history, losses=losses, initial_loss=losses[0], final_loss=losses[-1],
        tokens_per_s=timed[-1] if timed else None,  # mean over the steps after the warm-up
        peak_memory_bytes=history[-1].get("peak_memory_bytes"),  # rank 0's
        checkpoint=result.checkpoint.path if result.checkpoint else None, wall_s=wall_s,
    )
    rate = f"{timed[-1]:,.0f} tokens/s" if timed else "no timed steps"
    print(f"final: loss {losses[0]:.4f} -> {losses[-1]:.4f}, {rate} on {history[-1]['world_size']} workers -> {path}")


if __name__ == "__main__":
    main()
