#!/usr/bin/env bash
# Issue 6 evidence on the GPU machine: Unsloth vs plain TRL + PEFT (SDPA), LoRA SFT of the full-size
# Llama-3.2-3B stand-in (random weights), same data, LoRA and batch; tokens/s and peak memory per GPU.
# Runs, one at a time: Unsloth on 1 GPU, TRL on 1 GPU, Unsloth DDP on 2 GPUs, TRL DDP on 2 GPUs (the
# 2026-11-30 run had the two 1-GPU runs side by side, one per GPU, which made Unsloth's 1 -> 2 GPU scaling
# read 2.11x: a 1-GPU figure must not share the host with another run). Needs the `unsloth` and `trl` profiles of shared/device/pack-site.sh carried (.devsite/).
# Knobs: STEPS (optimizer steps, warm-up included), WARMUP (untimed first steps).
set -uo pipefail
out=$RESULTS/unsloth; mkdir -p "$out"
model=/tmp/standins/llama-3.2-3b-full
steps=${STEPS:-10}; warmup=${WARMUP:-3}
export UNSLOTH_COMPILE_LOCATION=/tmp/unsloth_compiled_cache  # shared by the runs, not in the repo
python3 -m nbhelpers.standins make llama-3.2-3b --size full --weights --out "$model" 2>&1 | tail -1
bench() {  # bench ENGINE GPUS NAME [CUDA_VISIBLE_DEVICES]
  CUDA_VISIBLE_DEVICES=${4:-0,1} torchrun --nproc-per-node "$2" --master-port $((29500 + RANDOM % 1000)) \
    benchmarks/unsloth_vs_trl.py --engine "$1" --model "$model" --steps "$steps" --warmup "$warmup" \
    --out "$out/$3.json" > "$out/$3.log" 2>&1
  echo "$3: rc=$? $(grep -E 'tokens/s' "$out/$3.log" | tail -1)"
}
bench unsloth 1 unsloth_1gpu 0
bench trl 1 trl_1gpu 0
bench unsloth 2 unsloth_2gpu
bench trl 2 trl_2gpu
python3 - "$out" <<'PY'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
runs = {p.stem: json.loads(p.read_text()) for p in sorted(out.glob("*_[12]gpu.json"))}
summary = {name: {"tokens_per_s": r["tokens_per_s"], "peak_allocated_gib": [round(b / 2**30, 2) for b in r["peak_memory_allocated_bytes"]],
                  "peak_reserved_gib": [round(b / 2**30, 2) for b in r["peak_memory_reserved_bytes"]],
                  "timed_steps": r["timed_steps"], "tokens_per_step": r["tokens_per_step"], "last_loss": r["losses"][-1:]}
           for name, r in runs.items()}
def ratio(a, b, key):
    return runs[a][key] / runs[b][key] if a in runs and b in runs else None
if "unsloth_2gpu" in runs and "trl_2gpu" in runs:
    summary["unsloth_vs_trl_2gpu_speed"] = ratio("unsloth_2gpu", "trl_2gpu", "tokens_per_s")
    summary["unsloth_vs_trl_2gpu_peak_memory"] = max(runs["unsloth_2gpu"]["peak_memory_allocated_bytes"]) / max(runs["trl_2gpu"]["peak_memory_allocated_bytes"])
if "unsloth_1gpu" in runs and "trl_1gpu" in runs:
    summary["unsloth_vs_trl_1gpu_speed"] = ratio("unsloth_1gpu", "trl_1gpu", "tokens_per_s")
    summary["unsloth_vs_trl_1gpu_peak_memory"] = max(runs["unsloth_1gpu"]["peak_memory_allocated_bytes"]) / max(runs["trl_1gpu"]["peak_memory_allocated_bytes"])
summary["unsloth_scaling_1_to_2"] = ratio("unsloth_2gpu", "unsloth_1gpu", "tokens_per_s")
summary["trl_scaling_1_to_2"] = ratio("trl_2gpu", "trl_1gpu", "tokens_per_s")
(out / "summary.json").write_text(json.dumps(summary, indent=2))
print(json.dumps(summary, indent=2))
PY
rm -rf "$model"
