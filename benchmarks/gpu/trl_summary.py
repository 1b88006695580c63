"""Summarise benchmarks/gpu/trl.sh: read each run's metrics.json, write summary.json, print one line per stage.

    python3 benchmarks/gpu/trl_summary.py RESULTS_DIR

A run that failed or was skipped shows up as missing, never as a number.
"""
from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

GIB = 2**30


def load(results: Path, run: str) -> dict | None:
    path = results / run / "metrics.json"
    return json.loads(path.read_text()) if path.exists() else None


def planned_gib(results: Path, name: str) -> float | None:
    """The planner's total for one GPU without DDP (the notebook's one-GPU run), from its printed table."""
    path = results / name
    found = path.exists() and re.search(r"^1 GPU, no DDP\s.*?([\d.]+)\s+[\d.]+\s+(?:yes|no)\b", path.read_text(), re.MULTILINE)
    return float(found.group(1)) if found else None


def text(results: Path, name: str) -> str | None:
    path = results / name
    return path.read_text().strip() if path.exists() else None


def common(metrics: dict) -> dict:
    """What every TRL run reports: loss curve, throughput, peak memory, world size, resumption, MLflow run."""
    return {"world_size": metrics["world_size"], "losses": metrics["losses"], "initial_loss": metrics["initial_loss"],
            "final_loss": metrics["final_loss"], "tokens_per_s": metrics["tokens_per_s"][0],
            "peak_memory_gib": [round(v / GIB, 2) for v in metrics["peak_memory_bytes"]],
            "resumed_from": metrics["resumed_from"][0], "device": metrics["device"][0],
            "mlflow_run_id": metrics.get("mlflow_run_id")}


def summarise(results: Path) -> dict:
    summary = {}
    m = load(results, "20b_1gpu")
    s = {"layers": 24, "of_layers": 24, "killed_run_left": text(results, "20b_1gpu_checkpoints_after_kill.txt"),
         "kill": text(results, "20b_1gpu_hooks/kill_rank_after_checkpoint.jsonl"),
         "planned_gib_seq2048": planned_gib(results, "plan_gpt_oss_20b_seq2048.txt"),
         "planned_gib_seq256": planned_gib(results, "plan_gpt_oss_20b_seq256.txt"),
         "merged_size": text(results, "20b_1gpu_merged_size.txt")}
    if m:
        s.update(common(m), checkpoint_quantization=m["checkpoint_quantization"], reply=m["reply"],
                 reply_has_final=m["reply_has_final"], final_token_accuracy=m["final_token_accuracy"],
                 merged_vs_adapter_max_logit_diff=m["merged_vs_adapter_max_logit_diff"])
    summary["gpt_oss_20b_1gpu"] = s

    m = load(results, "llama_1gpu")
    s = {}
    if m:
        s.update(common(m), engine=m["engine"][0], zero_stage=m["zero_stage"][0],
                 parameters_held_fraction_max=m["parameters_held_fraction_max"],
                 partitioned_across_ranks=m["partitioned_across_ranks"], eval_losses=m["eval_losses"], answer=m["answer"])
    summary["llama_3_2_1b_zero3_1gpu"] = s

    m = load(results, "120b_1gpu")
    s = {"of_layers": 36}
    if m:
        s.update(common(m), fsdp_enabled=m["fsdp_enabled"][0], fsdp_module_types=m["fsdp_module_types"][0],
                 parameters_total=m["parameters_total"][0], parameters_held_fraction_max=m["parameters_held_fraction_max"],
                 decoder_layers_sharded=m["decoder_layers_sharded"], adapter_matches_peft=m["adapter_matches_peft"],
                 merged_vs_adapter_max_logit_diff=m["merged_vs_adapter_max_logit_diff"], reply=m["reply"])
    summary["gpt_oss_120b_fsdp_1gpu"] = s

    summary.update(two_gpus(results))
    runs = ("20b_1gpu", "llama_1gpu", "120b_1gpu", "20b_2gpu", "120b_2gpu", "llama_zero3_2gpu")
    any_run = next((load(results, r) for r in runs if load(results, r)), None)
    if any_run:
        summary["environment"] = any_run["environment"]
    if (results / "stages.tsv").exists():
        summary["stages"] = (results / "stages.tsv").read_text().splitlines()
    return summary


def two_gpus(results: Path) -> dict:
    """The optional 2-GPU stages (issue 23): DDP scaling, FSDP2 memory per GPU, ZeRO-3 vs DDP memory."""
    found = {}
    one, two = load(results, "20b_1of2gpu"), load(results, "20b_2gpu")
    if one and two:
        found["gpt_oss_20b_ddp_1_vs_2gpu"] = {
            "one_gpu": common(one), "two_gpus": common(two), "wrapped_model": two["wrapped_model"],
            "speedup": two["tokens_per_s"][0] / one["tokens_per_s"][0], "goal_speedup": 1.9,
            "adapter_identical_across_ranks": two["adapter_identical_across_ranks"]}
    fsdp = load(results, "120b_2gpu")
    if fsdp:
        found["gpt_oss_120b_fsdp2_2gpu"] = {
            **common(fsdp), "fsdp_module_types": fsdp["fsdp_module_types"][0], "dtensor_fraction": fsdp["dtensor_fraction"],
            "parameters_held_per_rank": fsdp["parameters_held"], "parameters_total": fsdp["parameters_total"][0],
            "unsharded_parameter_gib": round(fsdp["unsharded_bytes"][0] / GIB, 2),
            "held_parameter_gib_per_rank": [round(b / GIB, 2) for b in fsdp["held_bytes"]],
            "decoder_layers_sharded": fsdp["decoder_layers_sharded"]}
    zero3, ddp = load(results, "llama_zero3_2gpu"), load(results, "llama_ddp_2gpu")
    if zero3 and ddp:
        found["llama_3_2_1b_zero3_vs_ddp_2gpu"] = {
            "zero3": common(zero3), "ddp": common(ddp), "goal_memory_ratio": 0.6,
            "memory_ratio": max(zero3["peak_memory_bytes"]) / max(ddp["peak_memory_bytes"]),
            "tokens_per_s_ratio": zero3["tokens_per_s"][0] / ddp["tokens_per_s"][0]}
    return found


def report(summary: dict) -> str:
    s = summary["gpt_oss_20b_1gpu"]
    lines = [f"GPT-OSS-20B, 24 layers, 1 GPU: {s.get('tokens_per_s', 'missing')} tok/s; peak "
             f"{s.get('peak_memory_gib', 'missing')} GiB (planner: {s['planned_gib_seq256']} GiB at 256 tokens, "
             f"{s['planned_gib_seq2048']} at 2048); loss {s.get('initial_loss', 'missing')} -> "
             f"{s.get('final_loss', 'missing')}; killed run left {s['killed_run_left']!r}, rerun resumed from "
             f"{s.get('resumed_from', 'missing')}; merged vs base + adapter: max logit difference "
             f"{s.get('merged_vs_adapter_max_logit_diff', 'missing')}; answer has a final channel: "
             f"{s.get('reply_has_final', 'missing')}"]
    s = summary["llama_3_2_1b_zero3_1gpu"]
    lines.append(f"Llama-3.2-1B, ZeRO-3, 1 GPU: {s.get('engine', 'missing')} stage {s.get('zero_stage', 'missing')}; "
                 f"held fraction {s.get('parameters_held_fraction_max', 'missing')}; {s.get('tokens_per_s', 'missing')} "
                 f"tok/s; peak {s.get('peak_memory_gib', 'missing')} GiB")
    s = summary["gpt_oss_120b_fsdp_1gpu"]
    lines.append(f"GPT-OSS-120B stand-in, FSDP2, 1 GPU: FSDP {s.get('fsdp_enabled', 'missing')}, held fraction "
                 f"{s.get('parameters_held_fraction_max', 'missing')}; {s.get('tokens_per_s', 'missing')} tok/s; peak "
                 f"{s.get('peak_memory_gib', 'missing')} GiB; merged vs base + adapter "
                 f"{s.get('merged_vs_adapter_max_logit_diff', 'missing')}")
    for name in ("gpt_oss_20b_ddp_1_vs_2gpu", "gpt_oss_120b_fsdp2_2gpu", "llama_3_2_1b_zero3_vs_ddp_2gpu"):
        if name in summary:
            shown = {k: v for k, v in summary[name].items() if not isinstance(v, dict) and k != "losses"}
            lines.append(f"{name}: {json.dumps(shown, default=str)}")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path)
    args = parser.parse_args(argv)
    summary = summarise(args.results)
    (args.results / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    print(report(summary))


if __name__ == "__main__":
    main()
