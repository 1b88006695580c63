#!/usr/bin/env bash
# Issue 7 evidence on the GPU machine: the Axolotl notebook through papermill with the full-size Olmo-3-7B
# stand-in (random bf16 weights), LoRA bf16 on 1 GPU and then DDP on 2 GPUs (`axolotl train` ->
# `accelerate launch`), same per-GPU batch; QLORA=1 adds a QLoRA (4-bit) run on 2 GPUs.
# Needs .devsite/axolotl/site.tar.gz (benchmarks/gpu/pack-axolotl.sh) besides the `notebook` profile of
# shared/device/pack-site.sh; Axolotl's pinned versions go first on PYTHONPATH for these runs only.
# Knobs: STEPS (optimizer steps; the first WARMUP logged steps are left out of tokens/s), QLORA=1.
set -uo pipefail
out=$RESULTS/axolotl; mkdir -p "$out"
steps=${STEPS:-8}; warmup=${WARMUP:-2}
# The packed stack: carried in .devsite/axolotl/, or unpacked into /tmp/site-axolotl by an earlier call on
# the same machine (with the notebook and MLflow profiles it is more than one call carries)
[ -f .devsite/axolotl/site.tar.gz ] || [ -d /tmp/site-axolotl/axolotl ] ||
  { echo "axolotl: .devsite/axolotl/site.tar.gz missing: run benchmarks/gpu/pack-axolotl.sh first"; exit 2; }
model=/tmp/standins/olmo-3-7b-full
python3 -m nbhelpers.standins make olmo-3-7b --size full --weights --out "$model" 2>&1 | tail -1  # with the machine's transformers
[ -f .devsite/axolotl/site.tar.gz ] && mkdir -p /tmp/site-axolotl && tar xzf .devsite/axolotl/site.tar.gz -C /tmp/site-axolotl
export PYTHONPATH=/tmp/site-axolotl:$PYTHONPATH AXOLOTL_DO_NOT_TRACK=1
python3 -c "import axolotl, transformers, trl, peft; print('axolotl', axolotl.__version__, 'transformers', transformers.__version__, 'trl', trl.__version__, 'peft', peft.__version__)" | tee "$out/versions.txt"
nb() {  # nb NAME GPUS [extra papermill args]
  local name=$1 gpus=$2; shift 2
  python3 -m papermill --execution-timeout 600 --no-progress-bar notebooks/axolotl/ddp_olmo3_7b.ipynb "$out/$name.ipynb" \
    -p output_dir "/tmp/axolotl_runs/$name" -p num_gpus "$gpus" -p base_model "$model" \
    -p dataset_path "$PWD/data/alpaca_messages/train.jsonl" -p max_steps "$steps" -p timing_warmup_steps "$warmup" \
    -p max_new_tokens 16 "$@" > "$out/$name.log" 2>&1
  echo "$name: rc=$?"
  cp "/tmp/axolotl_runs/$name/metrics.json" "$out/$name.json" 2>/dev/null
  cp "/tmp/axolotl_runs/$name/config.yml" "$out/$name.config.yml" 2>/dev/null
}
nb lora_1gpu 1
nb lora_2gpu 2
[ "${QLORA:-0}" = 1 ] && nb qlora_2gpu 2 -p load_in_4bit True
python3 - "$out" <<'PY'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
runs = {p.stem: json.loads(p.read_text()) for p in sorted(out.glob("*lora_[12]gpu.json"))}
summary = {name: {"world_size": r["world_size"], "tokens_per_s": r["tokens_per_s"],
                  "peak_memory_gib_per_gpu": [round(b / 2**30, 2) for b in r["peak_memory_bytes"]],
                  "rank0_peak_allocated_gib": round(r["rank0_peak_allocated_bytes"] / 2**30, 2),
                  "loss": [r["initial_loss"], r["final_loss"]], "eval_loss": r.get("final_eval_loss")}
           for name, r in runs.items()}
if "lora_1gpu" in runs and "lora_2gpu" in runs:
    summary["lora_scaling_1_to_2"] = runs["lora_2gpu"]["tokens_per_s"] / runs["lora_1gpu"]["tokens_per_s"]
(out / "summary.json").write_text(json.dumps(summary, indent=2))
print(json.dumps(summary, indent=2))
PY
rm -rf "$model" /tmp/axolotl_runs
