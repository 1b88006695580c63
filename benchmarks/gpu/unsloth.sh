#!/usr/bin/env bash
# Unsloth on the GPU machine, one stage at a time (STAGES, default "notebook compare"):
#  notebook  the Unsloth notebook through papermill with num_gpus=1 and its defaults apart from output_dir, the
#            full-size Llama-3.2-3B stand-in (random weights), the local FineTome-shaped data and STEPS steps, with a
#            checkpoint every 5 (issue 16: every notebook on one GPU; issue 18: checkpoints, the 16-bit merge, MLflow);
#  compare   Unsloth vs plain TRL + PEFT (SDPA), LoRA SFT of the same stand-in, same data, LoRA and batch
#            (benchmarks/unsloth_vs_trl.py), and Unsloth imported after Transformers and PEFT (what its warning
#            costs): tokens/s and peak memory, one run at a time on 1 GPU; on a machine with 2 GPUs also DDP on 2
#            (the 2026-11-30 run had the two 1-GPU runs side by side, one per GPU, which made the 1 -> 2 GPU
#            scaling read 2.11x: a 1-GPU figure must not share the host with another run).
# Needs the `notebook`, `trl` and `unsloth` profiles of benchmarks/gpu/pack-site.sh and MLflow's client
# (benchmarks/gpu/pack-extra.sh) carried in .devsite/.
# Knobs: STEPS (optimizer steps, warm-up included), WARMUP (untimed first steps), STAGES, SIZE (full; tiny for a
# dry run on a CPU).
set -uo pipefail
out=$RESULTS/unsloth; mkdir -p "$out"
size=${SIZE:-full}; model=/tmp/standins/llama-3.2-3b-$size
steps=${STEPS:-10}; warmup=${WARMUP:-3}; stages=${STAGES:-notebook compare}
gpus=$(python3 -c "import torch; print(torch.cuda.device_count())")
export UNSLOTH_COMPILE_LOCATION=/tmp/unsloth_compiled_cache  # shared by the runs, not in the repo
python3 tests/standins.py make llama-3.2-3b --size "$size" --weights --out "$model" 2>&1 | tail -1
if [[ " $stages " == *" notebook "* ]]; then
  started=$(date +%s) config=/tmp/unsloth_notebook.yaml
  printf 'save_steps: 5\nlogging_steps: 1\n' > "$config"  # SFTConfig fields the notebook takes through `config`
  python3 -m papermill --execution-timeout 600 --no-progress-bar notebooks/unsloth/ddp_llama_3_2_3b.ipynb \
    "$out/notebook_1gpu.ipynb" -p output_dir /tmp/unsloth_runs/notebook_1gpu -p num_gpus 1 \
    -p model_name_or_path "$model" -p dataset_name "$PWD/data/finetome" -p max_steps "$steps" \
    -p config "$config" > "$out/notebook_1gpu.log" 2>&1
  echo "notebook_1gpu: rc=$? in $(( $(date +%s) - started )) s"
  cp /tmp/unsloth_runs/notebook_1gpu/metrics.json "$out/notebook_1gpu.json" 2>/dev/null
fi
bench() {  # bench ENGINE GPUS NAME CUDA_VISIBLE_DEVICES
  local started=$(date +%s)
  CUDA_VISIBLE_DEVICES=$4 torchrun --standalone --nproc-per-node "$2" benchmarks/unsloth_vs_trl.py --engine "$1" \
    --model_name_or_path "$model" --max_steps "$steps" --timing_warmup_steps "$warmup" --out "$out/$3.json" \
    > "$out/$3.log" 2>&1
  echo "$3: rc=$? in $(( $(date +%s) - started )) s $(grep -E 'tokens/s' "$out/$3.log" | tail -1)"
}
if [[ " $stages " == *" compare "* ]]; then
  bench unsloth 1 unsloth_1gpu 0
  bench unsloth-late 1 unsloth_late_1gpu 0  # imported after Transformers and PEFT: what Unsloth's warning costs
  bench trl 1 trl_1gpu 0
  bench unsloth 1 unsloth_repeat_1gpu 0  # the same run again: the spread a difference must beat
  if [ "$gpus" -ge 2 ]; then
    bench unsloth 2 unsloth_2gpu 0,1
    bench trl 2 trl_2gpu 0,1
  fi
fi
python3 - "$out" <<'PY'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
runs = {p.stem: json.loads(p.read_text()) for p in sorted(out.glob("*_[12]gpu.json")) if p.stem != "notebook_1gpu"}
summary = {name: {"tokens_per_s": r["tokens_per_s"], "peak_allocated_gib": [round(b / 2**30, 2) for b in r["peak_memory_allocated_bytes"]],
                  "peak_reserved_gib": [round(b / 2**30, 2) for b in r["peak_memory_reserved_bytes"]],
                  "timed_steps": r["timed_steps"], "tokens_per_step": r["tokens_per_step"], "last_loss": r["losses"][-1:]}
           for name, r in runs.items()}
def ratio(a, b, key):
    return runs[a][key] / runs[b][key] if a in runs and b in runs else None
for n in (1, 2):
    if f"unsloth_{n}gpu" in runs and f"trl_{n}gpu" in runs:
        summary[f"unsloth_vs_trl_{n}gpu_speed"] = ratio(f"unsloth_{n}gpu", f"trl_{n}gpu", "tokens_per_s")
        summary[f"unsloth_vs_trl_{n}gpu_peak_memory"] = (max(runs[f"unsloth_{n}gpu"]["peak_memory_allocated_bytes"])
                                                         / max(runs[f"trl_{n}gpu"]["peak_memory_allocated_bytes"]))
summary["unsloth_late_vs_unsloth_1gpu_speed"] = ratio("unsloth_late_1gpu", "unsloth_1gpu", "tokens_per_s")
summary["unsloth_repeat_vs_unsloth_1gpu_speed"] = ratio("unsloth_repeat_1gpu", "unsloth_1gpu", "tokens_per_s")
summary["unsloth_warned_of_import_order"] = {  # in which runs Unsloth said it was imported after Transformers
    log.stem: "Unsloth should be imported before" in log.read_text(errors="replace") for log in sorted(out.glob("*.log"))}
summary["unsloth_scaling_1_to_2"] = ratio("unsloth_2gpu", "unsloth_1gpu", "tokens_per_s")
summary["trl_scaling_1_to_2"] = ratio("trl_2gpu", "trl_1gpu", "tokens_per_s")
notebook = out / "notebook_1gpu.json"
if notebook.exists():
    m = json.loads(notebook.read_text())
    summary["notebook_1gpu"] = {key: m.get(key) for key in (
        "world_size", "initial_loss", "final_loss", "tokens_per_s", "peak_memory_bytes", "reply")}
(out / "summary.json").write_text(json.dumps(summary, indent=2))
print(json.dumps(summary, indent=2))
PY
rm -rf "$model" /tmp/unsloth_runs
