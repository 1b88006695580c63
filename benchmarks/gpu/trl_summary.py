"""Summarise benchmarks/gpu/trl.sh: read each run's metrics.json, write summary.json, print the comparisons.

    python3 benchmarks/gpu/trl_summary.py RESULTS_DIR --layers-20b 8 --layers-120b 4

A run that failed or was skipped shows up as missing, never as a number.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

GIB = 2**30


def load(results: Path, run: str) -> dict | None:
    path = results / run / "metrics.json"
    return json.loads(path.read_text()) if path.exists() else None


def standin_parameters(results: Path, arch: str, models: Path | None) -> int | None:
    if models is None:
        return None
    path = models / arch / "standin.json"
    return json.loads(path.read_text())["parameters"] if path.exists() else None


def gib(values):
    return [round(v / GIB, 2) for v in values]


def summarise(results: Path, layers_20b: int, layers_120b: int, models: Path | None) -> dict:
    summary = {}
    one, two = load(results, "ddp_20b_1gpu"), load(results, "ddp_20b_2gpu")
    s = {"layers": layers_20b, "of_layers": 24, "parameters": standin_parameters(results, "gpt-oss-20b", models),
         "goal_speedup": 1.9}
    if one:
        s.update(tokens_per_s_1gpu=one["tokens_per_s"], peak_memory_gib_1gpu=gib(one["peak_memory_bytes"]),
                 timed_steps=one["timed_steps"])
    if two:
        s.update(tokens_per_s_2gpu=two["tokens_per_s"], peak_memory_gib_2gpu=gib(two["peak_memory_bytes"]),
                 wrapped_model_2gpu=two["wrapped_model"], reply_2gpu=two.get("reply"))
    if one or two:  # "mxfp4": the experts were stored as on the hub and dequantised on load
        s["checkpoint_quantization"] = (two or one).get("checkpoint_quantization")
    if one and two:
        s["speedup"] = two["tokens_per_s"] / one["tokens_per_s"]
        s["goal_met"] = s["speedup"] >= s["goal_speedup"]
    summary["gpt_oss_20b_ddp"] = s

    fsdp = load(results, "fsdp_120b_2gpu")
    s = {"layers": layers_120b, "of_layers": 36, "parameters": standin_parameters(results, "gpt-oss-120b", models)}
    if fsdp:
        peaks = fsdp["peak_memory_bytes"]
        s.update(world_size=fsdp["world_size"], fsdp_enabled=fsdp["fsdp_enabled"],
                 fsdp_module_types=fsdp["fsdp_module_types"], dtensor_fraction=fsdp["dtensor_fraction"],
                 parameters_held_per_rank=fsdp["parameters_held_per_rank"], parameters_total=fsdp["parameters_total"],
                 unsharded_parameter_gib=round(fsdp["unsharded_parameter_bytes"] / GIB, 2),
                 held_parameter_gib_per_rank=gib(fsdp["held_parameter_bytes_per_rank"]),
                 peak_memory_gib_per_gpu=gib(peaks),
                 peak_memory_vs_unsharded=[p / fsdp["unsharded_parameter_bytes"] for p in peaks],
                 lora_rank_attention=fsdp["lora_rank_attention"], lora_rank_experts=fsdp["lora_rank_experts"],
                 tokens_per_s=fsdp["tokens_per_s"], losses=fsdp["losses"],
                 checkpoint_quantization=fsdp.get("checkpoint_quantization"))
    summary["gpt_oss_120b_fsdp2"] = s

    zero3, ddp = load(results, "llama_zero3_2gpu"), load(results, "llama_ddp_2gpu")
    s = {"layers": 16, "of_layers": 16, "goal_memory_ratio": 0.6}
    if zero3:
        s.update(zero3_engine=zero3["engine"], zero3_peak_memory_gib=gib(zero3["peak_memory_bytes"]),
                 zero3_tokens_per_s=zero3["tokens_per_s"], zero3_parameters_held_fraction=zero3["parameters_held_fraction_max"],
                 zero3_answer=zero3.get("answer"))
    if ddp:
        s.update(ddp_engine=ddp["engine"], ddp_peak_memory_gib=gib(ddp["peak_memory_bytes"]), ddp_tokens_per_s=ddp["tokens_per_s"])
    if zero3 and ddp:
        s["memory_ratio"] = max(zero3["peak_memory_bytes"]) / max(ddp["peak_memory_bytes"])
        s["goal_met"] = s["memory_ratio"] <= s["goal_memory_ratio"]
        s["tokens_per_s_ratio"] = zero3["tokens_per_s"] / ddp["tokens_per_s"]
    summary["llama_3_2_1b_zero3_vs_ddp"] = s

    any_run = next((m for m in (one, two, fsdp, zero3, ddp) if m), None)
    if any_run:
        summary["environment"] = any_run["environment"]
    stages = results / "stages.tsv"
    if stages.exists():
        summary["stages"] = stages.read_text().splitlines()
    return summary


def report(summary: dict) -> str:
    lines = []
    s = summary["gpt_oss_20b_ddp"]
    lines.append(f"GPT-OSS-20B ({s['layers']} of {s['of_layers']} layers) LoRA, DDP: "
                 f"{s.get('tokens_per_s_1gpu', 'missing')} tok/s on 1 GPU, {s.get('tokens_per_s_2gpu', 'missing')} on 2; "
                 f"speed-up {s.get('speedup', 'missing')} (goal >= {s['goal_speedup']})")
    s = summary["gpt_oss_120b_fsdp2"]
    lines.append(f"GPT-OSS-120B ({s['layers']} of {s['of_layers']} layers) LoRA, FSDP2 on {s.get('world_size', '?')} GPUs: "
                 f"unsharded {s.get('unsharded_parameter_gib', 'missing')} GiB; peak per GPU "
                 f"{s.get('peak_memory_gib_per_gpu', 'missing')} GiB; DTensor share {s.get('dtensor_fraction', 'missing')}")
    s = summary["llama_3_2_1b_zero3_vs_ddp"]
    lines.append(f"Llama-3.2-1B full FT, 2 GPUs: peak per GPU ZeRO-3 {s.get('zero3_peak_memory_gib', 'missing')} GiB vs DDP "
                 f"{s.get('ddp_peak_memory_gib', 'missing')} GiB, ratio {s.get('memory_ratio', 'missing')} "
                 f"(goal <= {s['goal_memory_ratio']}); tok/s ZeRO-3 {s.get('zero3_tokens_per_s', 'missing')}, "
                 f"DDP {s.get('ddp_tokens_per_s', 'missing')}")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path)
    parser.add_argument("--layers-20b", type=int, required=True)
    parser.add_argument("--layers-120b", type=int, required=True)
    parser.add_argument("--models", type=Path, default=None, help="the stand-ins' folder (for parameter counts)")
    args = parser.parse_args(argv)
    summary = summarise(args.results, args.layers_20b, args.layers_120b, args.models)
    (args.results / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    print(report(summary))


if __name__ == "__main__":
    main()
