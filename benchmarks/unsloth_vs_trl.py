"""Unsloth vs plain TRL + PEFT: LoRA SFT tokens/s and peak memory per GPU, the same model, data, LoRA and batch.

    torchrun --nproc-per-node 2 benchmarks/unsloth_vs_trl.py --engine unsloth --model_name_or_path DIR --out u.json
    torchrun --nproc-per-node 2 benchmarks/unsloth_vs_trl.py --engine trl --model_name_or_path DIR --out t.json

Both engines train the recipe of notebooks/unsloth/ddp_llama_3_2_3b.ipynb: LoRA r=16, alpha=16, dropout 0 on
q/k/v/o/gate/up/down, bf16, 8-bit AdamW (GPU), lr 2e-4 linear, batch 2 x grad accum 4 per GPU, sequences of
up to 2048 tokens, gradient checkpointing (Unsloth's offloaded "unsloth" mode vs Transformers' non-reentrant
checkpointing), DDP through the Trainer. Plain TRL uses SDPA attention.
The data are data/finetome conversations joined into multi-turn conversations of about `--max_length` tokens,
so every micro-batch is a full 2048-token batch (FineTome's own conversations are a few hundred tokens).
The loss covers every token in both (masking prompts does not change the work done).
The engines run in separate processes: importing Unsloth patches Transformers, PEFT and TRL for good.
`--engine unsloth-late` is Unsloth imported after Transformers and PEFT, as the notebook's ranks did until
2026-12-04 (they loaded the helpers, then nbhelpers.hf, first): Unsloth then warns that some optimisations are missing; this measures them.
Without a GPU it runs on the CPU (fp32, torch AdamW, gloo) so that its logic can be tested with a tiny stand-in.
The flags take the cookbook's names for its settings (README, "One name for each setting").
"""
from __future__ import annotations

import argparse
import sys


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--engine", choices=["unsloth", "unsloth-late", "trl"], required=True)
    parser.add_argument("--model_name_or_path", required=True,
                        help="model folder (e.g. the full-size llama-3.2-3b stand-in)")
    parser.add_argument("--dataset_name", default="data/finetome/train.jsonl", help="FineTome-style JSONL")
    parser.add_argument("--max_length", type=int, default=2048, help="tokens per (joined) conversation")
    parser.add_argument("--per_device_train_batch_size", type=int, default=2, help="per GPU per micro-step")
    parser.add_argument("--gradient_accumulation_steps", type=int, default=4)
    parser.add_argument("--max_steps", type=int, default=12, help="optimizer steps, warm-up included")
    parser.add_argument("--timing_warmup_steps", type=int, default=3, help="first steps left out of the timing")
    parser.add_argument("--lora_r", type=int, default=16)
    parser.add_argument("--out", required=True, help="result JSON (written by rank 0)")
    return parser.parse_args(argv)


args = parse_args()
if args.engine == "unsloth-late":
    import peft  # noqa: F401
    import transformers  # noqa: F401
if args.engine.startswith("unsloth"):
    import unsloth  # noqa: F401  first: it patches Transformers, PEFT and TRL as they are imported

import json  # noqa: E402
import os  # noqa: E402
import random  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from datasets import Dataset  # noqa: E402
from trl import SFTConfig, SFTTrainer  # noqa: E402

from nbhelpers.training.trainer_log import StepTimer, logged  # noqa: E402

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def long_conversations(path, tokenizer, seq_len, count, seed=0):
    """`count` chat texts of about seq_len tokens, each several FineTome conversations joined as one chat."""
    rows = [json.loads(line)["conversations"] for line in Path(path).read_text().splitlines() if line.strip()]
    roles = {"human": "user", "gpt": "assistant", "system": "system"}
    rng = random.Random(seed)
    texts, messages, order = [], [], []
    while len(texts) < count:
        if not order:
            order = list(range(len(rows)))
            rng.shuffle(order)
        turns = [{"role": roles[t["from"]], "content": t["value"]} for t in rows[order.pop()] if t["from"] != "system"]
        candidate = messages + turns
        text = tokenizer.apply_chat_template(candidate, tokenize=False)
        if messages and len(tokenizer(text, add_special_tokens=False)["input_ids"]) > seq_len:
            texts.append(tokenizer.apply_chat_template(messages, tokenize=False))
            messages = turns
        else:
            messages = candidate
    return texts


ON_GPU = torch.cuda.is_available()
DTYPE = torch.bfloat16 if ON_GPU else torch.float32


def load(engine, model_path, seq_len, lora_r, device):
    if engine.startswith("unsloth"):
        from unsloth import FastLanguageModel

        model, tokenizer = FastLanguageModel.from_pretrained(
            model_name=model_path, max_seq_length=seq_len, dtype=DTYPE, load_in_4bit=False, device_map={"": device})
        model = FastLanguageModel.get_peft_model(
            model, r=lora_r, lora_alpha=16, lora_dropout=0, target_modules=TARGETS, bias="none",
            use_gradient_checkpointing="unsloth", random_state=3407)
        return model, tokenizer, None, {}
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from nbhelpers.training.activation_checkpointing import checkpointing_fields

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=DTYPE, attn_implementation="sdpa",
                                                 device_map={"": device})
    peft_config = LoraConfig(r=lora_r, lora_alpha=16, lora_dropout=0.0, target_modules=TARGETS, bias="none",
                             task_type="CAUSAL_LM")
    gc = checkpointing_fields(True, use_reentrant=False)  # by the names this Transformers has
    return model, tokenizer, peft_config, gc


def main():
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if ON_GPU:
        torch.cuda.set_device(local_rank)
    world_size = int(os.environ.get("WORLD_SIZE", 1))
    started = time.perf_counter()
    model, tokenizer, peft_config, checkpointing = load(args.engine, args.model_name_or_path, args.max_length,
                                                        args.lora_r, local_rank if ON_GPU else "cpu")
    loaded = time.perf_counter() - started
    count = args.max_steps * args.gradient_accumulation_steps * args.per_device_train_batch_size * world_size
    dataset = Dataset.from_dict({"text": long_conversations(args.dataset_name, tokenizer, args.max_length, count)})
    config = SFTConfig(
        output_dir=f"/tmp/unsloth_vs_trl/{args.engine}-{world_size}",
        per_device_train_batch_size=args.per_device_train_batch_size,
        gradient_accumulation_steps=args.gradient_accumulation_steps,
        max_steps=args.max_steps,
        learning_rate=2e-4,
        lr_scheduler_type="linear",
        warmup_steps=1,
        optim="adamw_8bit" if ON_GPU else "adamw_torch",
        weight_decay=0.01,
        bf16=ON_GPU,
        max_length=args.max_length,
        dataset_text_field="text",
        packing=False,
        ddp_find_unused_parameters=False,
        include_num_input_tokens_seen="non_padding",
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        seed=3407,
        **checkpointing,
    )
    timer = StepTimer()
    trainer = SFTTrainer(model=model, args=config, train_dataset=dataset, processing_class=tokenizer,
                         peft_config=peft_config, callbacks=[timer])
    trainer.train()
    first, timed_steps = timer.first_timed(args.timing_warmup_steps), timer.timed_steps(args.timing_warmup_steps)
    tokens_per_s = timer.tokens_per_second(args.timing_warmup_steps)
    if ON_GPU:
        memory = torch.tensor([torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()], device="cuda")
    else:  # peak RSS of this process (Linux reports KiB)
        import resource

        memory = torch.tensor([resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024] * 2)
    gathered = [memory]
    if dist.is_initialized():  # the Trainer starts a process group when torchrun started several processes
        gathered = [torch.zeros_like(memory) for _ in range(world_size)]
        dist.all_gather(gathered, memory)
    if int(os.environ.get("RANK", 0)) == 0:
        from importlib import metadata

        versions = {}
        for name in ("torch", "transformers", "trl", "peft", "accelerate", "unsloth", "unsloth_zoo", "bitsandbytes"):
            try:
                versions[name] = metadata.version(name)
            except metadata.PackageNotFoundError:
                pass
        result = {
            "engine": args.engine, "world_size": world_size, "model": args.model_name_or_path,
            "seq_len": args.max_length, "batch_size_per_gpu": args.per_device_train_batch_size,
            "grad_accum": args.gradient_accumulation_steps, "lora_r": args.lora_r, "steps": args.max_steps,
            "timed_steps": timed_steps,
            "tokens_per_s": tokens_per_s, "tokens_per_s_per_gpu": tokens_per_s / world_size,
            "tokens_per_step": (timer.tokens[-1] - timer.tokens[first]) / timed_steps,
            "step_seconds": [b - a for a, b in zip(timer.times, timer.times[1:])],
            "peak_memory_allocated_bytes": [int(g[0]) for g in gathered],
            "peak_memory_reserved_bytes": [int(g[1]) for g in gathered],
            "losses": logged(trainer), "load_seconds": loaded,
            "trainable_parameters": sum(p.numel() for p in trainer.model.parameters() if p.requires_grad),
            "device": torch.cuda.get_device_name() if ON_GPU else "cpu", "versions": versions,
        }
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=2))
        print(f"{args.engine} on {world_size} GPU(s): {tokens_per_s:.0f} tokens/s, peak allocated "
              f"{[round(g[0].item() / 2**30, 1) for g in gathered]} GiB")
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
