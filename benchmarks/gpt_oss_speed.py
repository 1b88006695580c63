"""GPT-OSS LoRA training speed as the TRL notebooks configure it, one variant per run, for side-by-side runs in one
GPU call (benchmarks/gpu/gpt_oss.sh). Issue 38.

The model is a random-weight stand-in of the published shape (tests/standins.py), built on the GPU from its config;
the training settings are the notebook's own: its `lora_config`, `sft_config` (and for the 120B `fsdp_settings`)
cells are executed from the .ipynb, so what is measured is what the notebook trains. Data:
data/multilingual_thinking. `--attention_only_lora` (120B) runs the notebook with `EXPERTS = []`: what the experts' adapters
cost, side by side. The 120B's LoRA on the experts is computed on the routed tokens, as the notebook does
(nbhelpers.training.expert_lora); `--peft_expert_lora` leaves it to PEFT (W + BA for every expert, the notebook
before 2026-12-06), eager only: a compiled layer cannot hold PEFT's parametrization.

    python benchmarks/gpt_oss_speed.py OUT.json [--model gpt-oss-20b] [--layers N] [--torch_compile]
        [--packing] [--attention_only_lora | --peft_expert_lora] [--max_steps 10] [--profile PREFIX]
    torchrun --nproc-per-node 1 benchmarks/gpt_oss_speed.py OUT.json --model gpt-oss-120b --layers 8 ...  (FSDP)

Writes OUT.json: tokens/s of real (non-padding) tokens after 2 warm-up steps (and before the profiled ones), MFU (6 x active parameters per
token over 989 TFLOP/s, the convention of issue 38), peak memory, the first step's time, the losses.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch
from transformers import TrainerCallback

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
NOTEBOOKS = {"gpt-oss-20b": ROOT / "notebooks/trl/ddp_gpt_oss_20b.ipynb",
             "gpt-oss-120b": ROOT / "notebooks/trl/fsdp_gpt_oss_120b.ipynb"}
H100_H200_BF16 = 989e12


def active_parameters(model) -> float:
    """Parameters a token passes through in matmuls: the experts scaled by top-k / experts, no input embedding."""
    config = model.config
    share = config.num_experts_per_tok / config.num_local_experts
    embedding = model.get_input_embeddings().weight.numel()
    total = expert = 0
    for name, parameter in model.named_parameters():
        if "lora_" in name:
            continue
        total += parameter.numel()
        expert += parameter.numel() if ".experts." in name else 0
    return total - embedding - expert * (1 - share)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--model", default="gpt-oss-20b", choices=list(NOTEBOOKS))
    parser.add_argument("--layers", type=int, default=None)
    parser.add_argument("--torch_compile", action="store_true", help="compile each decoder layer, as the notebook does")
    parser.add_argument("--packing", action="store_true")
    parser.add_argument("--attention_only_lora", action="store_true", help="120B: the notebook's EXPERTS = []")
    parser.add_argument("--peft_expert_lora", action="store_true",
                        help="120B: the experts' LoRA as PEFT computes it (W + BA), not on the tokens; eager only")
    parser.add_argument("--max_steps", type=int, default=10)
    parser.add_argument("--per_device_train_batch_size", type=int, default=None)
    parser.add_argument("--gradient_accumulation_steps", type=int, default=None, help="default: the notebook's")
    parser.add_argument("--gradient_checkpointing", choices=["true", "false"], default=None,
                        help="default: the notebook's sft_config (on; its planner may turn it off)")
    parser.add_argument("--every_n_layers", type=int, default=None,
                        help="with checkpointing: only every n-th decoder layer (its _kwargs' every_n_layers)")
    parser.add_argument("--profile", default=None, help="profile the last step into PREFIX.txt")
    parser.add_argument("--size", default="full", choices=["full", "tiny"], help="tiny: check the script on a CPU")
    cli = parser.parse_args()
    if cli.peft_expert_lora and cli.torch_compile:
        parser.error("--peft_expert_lora runs eager: PEFT's parametrization recompiles on every call")

    import standins
    from datasets import load_dataset
    from transformers import AutoModelForCausalLM
    from trl import SFTTrainer

    from nbhelpers.training.activation_checkpointing import checkpointing_field
    from nbhelpers.training.expert_lora import lora_on_expert_activations
    from nbhelpers.training.packing import mask_packed_sequences
    from nbhelpers.training.trainer_log import StepTimer, logged
    from notebook_code import notebook_cells

    nb = notebook_cells(NOTEBOOKS[cli.model], "lora_config", "sft_config", "fsdp_settings")
    defaults = {"gpt-oss-20b": 4, "gpt-oss-120b": 2}
    args = SimpleNamespace(
        output_dir=str(Path(cli.out).with_suffix("")), learning_rate=2e-4, max_steps=cli.max_steps,
        per_device_train_batch_size=cli.per_device_train_batch_size or defaults[cli.model], max_length=2048,
        lora_r={"gpt-oss-20b": 8, "gpt-oss-120b": 32}[cli.model], fsdp_config="",
        sft_settings={"packing": cli.packing, "save_steps": 10_000, "report_to": [], "dataloader_num_workers": 0},
    )
    if cli.gradient_accumulation_steps:
        args.sft_settings["gradient_accumulation_steps"] = cli.gradient_accumulation_steps
    field = checkpointing_field()  # activation checkpointing's TrainingArguments field in this Transformers
    if cli.gradient_checkpointing:
        args.sft_settings[field] = cli.gradient_checkpointing == "true"
    if cli.every_n_layers:
        args.sft_settings[f"{field}_kwargs"] = {"use_reentrant": False, "every_n_layers": cli.every_n_layers}
    if cli.model == "gpt-oss-120b":  # built on the GPU here, not loaded by rank 0: nothing to broadcast
        args.sft_settings["fsdp_config"] = {**nb["fsdp_settings"](args), "cpu_ram_efficient_loading": False}
    sft = nb["sft_config"](args)

    on_gpu = torch.cuda.is_available()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if on_gpu else torch.device("cpu")
    config = standins.config(cli.model, cli.size, cli.layers)
    tokenizer = standins.tokenizer(cli.model)
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16 if on_gpu else torch.float32,
                                                 attn_implementation="flex_attention" if on_gpu else "eager")
    model.config.use_cache = False
    if cli.packing:  # as the notebook: each packed conversation attends only to itself
        mask_packed_sequences(model)
    if cli.attention_only_lora:  # the notebook's functions read it
        nb["EXPERTS"] = []
    experts_lora = bool(nb.get("EXPERTS"))
    if cli.torch_compile:  # as the notebooks: one graph per decoder layer, hooks outside it
        for layer in model.model.layers:
            layer.forward = torch.compile(layer.forward)
    dataset = load_dataset("json", data_files=str(ROOT / "data/multilingual_thinking/train.jsonl"), split="train")

    class Clock(TrainerCallback):
        def on_train_begin(self, *a, **k):
            self.begin = time.perf_counter()

        def on_step_end(self, *a, **k):
            if not hasattr(self, "first_step_s"):
                if on_gpu:
                    torch.cuda.synchronize()
                self.first_step_s = time.perf_counter() - self.begin

    timer, clock = StepTimer(), Clock()
    callbacks = [timer, clock]
    profiled_from = cli.max_steps - 1 if cli.profile else None  # the last step, after the timed ones
    if cli.profile:
        callbacks.append(Profiler(cli.profile, wait=profiled_from))
    trainer = SFTTrainer(model=model, args=sft, train_dataset=dataset, peft_config=nb["lora_config"](args),
                         processing_class=tokenizer, callbacks=callbacks)
    if cli.model == "gpt-oss-120b" and not cli.peft_expert_lora:  # as the notebook
        changed = lora_on_expert_activations(trainer.model)
        assert changed == (config.num_hidden_layers if experts_lora else 0), changed
    if on_gpu:
        torch.cuda.reset_peak_memory_stats(device)
    trainer.train()
    times, tokens = timer.times[:profiled_from], timer.tokens[:profiled_from]  # steps 3 .. the last unprofiled one
    tokens_per_s = (tokens[-1] - tokens[2]) / (times[-1] - times[2])
    active = active_parameters(trainer.model.get_base_model() if hasattr(trainer.model, "get_base_model")
                               else trainer.model)
    result = {
        "model": cli.model, "layers": config.num_hidden_layers, "torch_compile": cli.torch_compile,
        "lora_on_experts": experts_lora, "peft_expert_lora": cli.peft_expert_lora,
        "packing": cli.packing, "per_device_train_batch_size": args.per_device_train_batch_size,
        "gradient_accumulation_steps": sft.gradient_accumulation_steps, "max_length": sft.max_length,
        "tokens_per_s": tokens_per_s, "active_parameters": active,
        "mfu": tokens_per_s * 6 * active / H100_H200_BF16 if on_gpu else None,
        "tokens_per_step": (tokens[-1] - tokens[2]) / (len(tokens) - 3), "timed_steps": len(tokens) - 3,
        "first_step_s": clock.first_step_s, "steps": len(timer.times),
        "peak_memory_gib": torch.cuda.max_memory_allocated(device) / 2**30 if on_gpu else None,
        "losses": logged(trainer, "loss"),
        "device": torch.cuda.get_device_name(device) if on_gpu else "cpu",
        "versions": {m.__name__: m.__version__ for m in (torch, __import__("transformers"), __import__("trl"),
                                                         __import__("peft"))},
        "date": time.strftime("%Y-%m-%d"),
    }
    if int(os.environ.get("RANK", 0)) == 0:
        Path(cli.out).write_text(json.dumps(result, indent=1) + "\n")
        print(json.dumps({k: v for k, v in result.items() if k != "losses"}), flush=True)


class Profiler(TrainerCallback):
    """Profiles the optimizer step after `wait`: its GPU kernels' table (sorted by GPU time), the CPU ops' table, and
    where the GPU waited: its idle gaps by size, and by the CPU op running in the middle of each (gaps_report)."""

    def __init__(self, prefix, wait):
        self.prefix, self.wait, self.step, self.prof = prefix, wait, 0, None

    def on_step_end(self, *a, **k):
        from torch.profiler import ProfilerActivity, profile

        self.step += 1
        if self.step == self.wait:
            self.prof = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
            self.prof.start()
            self.started = time.perf_counter()
        elif self.step == self.wait + 1 and self.prof is not None:
            torch.cuda.synchronize()
            wall = time.perf_counter() - self.started
            self.prof.stop()
            events = self.prof.key_averages()
            key = "self_device_time_total" if hasattr(events[0], "self_device_time_total") else "self_cuda_time_total"
            busy = sum(getattr(e, key) for e in events if e.device_type == torch.autograd.DeviceType.CUDA) / 1e6
            table = events.table(sort_by=key, row_limit=40, max_name_column_width=90)
            cpu = events.table(sort_by="self_cpu_time_total", row_limit=30, max_name_column_width=90)
            Path(self.prefix + ".txt").write_text(
                f"1 optimizer step: wall {wall:.3f} s (profiled), GPU kernels busy {busy:.3f} s\n\n{table}\n\n"
                f"CPU ops by self CPU time:\n{cpu}\n\n{gaps_report(self.prof.events())}")
            self.prof = None


def gaps_report(events, min_gap_us: float = 20.0) -> str:
    """Where the GPU was idle between its first and last kernel: the gaps by size, and the gaps of at least
    `min_gap_us` summed by the CPU op (outermost, and innermost) that was running at each gap's middle, on any
    thread. `events`: the profiler's FunctionEvents (time_range in microseconds)."""
    import bisect
    from collections import Counter

    gpu = sorted((e.time_range.start, e.time_range.end) for e in events
                 if e.device_type == torch.autograd.DeviceType.CUDA)
    cpu = sorted((e for e in events if e.device_type == torch.autograd.DeviceType.CPU),
                 key=lambda e: e.time_range.start)
    if not gpu:
        return "no GPU kernels recorded"
    gaps, end = [], gpu[0][1]
    for start, stop in gpu[1:]:
        if start > end:
            gaps.append((end, start))
        end = max(end, stop)
    span = end - gpu[0][0]
    sizes = Counter()
    for g0, g1 in gaps:
        d = g1 - g0
        sizes["< 10 us" if d < 10 else "10-100 us" if d < 100 else "0.1-1 ms" if d < 1000 else ">= 1 ms"] += d
    starts = [e.time_range.start for e in cpu]
    outer, inner = Counter(), Counter()
    for g0, g1 in gaps:
        if g1 - g0 < min_gap_us:
            continue
        middle = (g0 + g1) / 2
        i = bisect.bisect_right(starts, middle)
        around = [e for e in cpu[max(0, i - 400):i] if e.time_range.end >= middle]
        if not around:
            outer["(no op: Python or waiting)"] += g1 - g0
            inner["(no op: Python or waiting)"] += g1 - g0
            continue
        innermost = max(around, key=lambda e: e.time_range.start)
        top = innermost
        while getattr(top, "cpu_parent", None) is not None:
            top = top.cpu_parent
        outer[top.name[:80]] += g1 - g0
        inner[innermost.name[:80]] += g1 - g0
    idle = sum(g1 - g0 for g0, g1 in gaps)
    lines = [f"GPU idle {idle / 1e3:.1f} ms of {span / 1e3:.1f} ms between the first and last kernel "
             f"({idle / span:.1%}), {len(gaps)} gaps: "
             + ", ".join(f"{k} {v / 1e3:.1f} ms" for k, v in sizes.items())]
    for title, counter in ((f"gaps >= {min_gap_us:g} us by the outermost CPU op at their middle", outer),
                           ("... by the innermost", inner)):
        lines += [title + ":"] + [f"  {v / 1e3:9.1f} ms  {k}" for k, v in counter.most_common(15)]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
