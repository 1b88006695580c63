#!/usr/bin/env bash
# Axolotl on the GPU machine (issues 21 §2 and 23): the Axolotl notebook through papermill with the full-size
# Olmo-3-7B stand-in (random bf16 weights), LoRA bf16 on 1 GPU and, where the machine has 2, DDP on 2 GPUs
# (`axolotl train --launcher torchrun`), the same per-GPU batch; QLORA=1 adds a QLoRA (4-bit) run on every GPU.
# Each run: Axolotl's own tokens/s (tokens/train_per_sec_per_gpu, the median window, times the GPUs) and token counts,
# peak memory per GPU (MLflow's system metrics: what nvidia-smi shows), the loss curve, checkpoints every 4 steps
# (sealed by the notebook's Axolotl plugin), the merged model's check against base + adapter.
# Needs .devsite/axolotl/site.tar.gz (benchmarks/gpu/pack-axolotl.sh: Axolotl's stack, papermill's kernel and
# MLflow's client in one pack) carried alone; Axolotl's pinned versions go first on PYTHONPATH for these runs only.
# Knobs: STEPS (optimizer steps), QLORA=1, SIZE (full; tiny for a dry run on a CPU, with PYTHONPATH already holding
# Axolotl's stack).
set -uo pipefail
out=$RESULTS/axolotl; mkdir -p "$out"
steps=${STEPS:-8}; size=${SIZE:-full}
# The packed stack: carried in .devsite/axolotl/, or unpacked into /tmp/site-axolotl by an earlier call on the machine
if [ -f .devsite/axolotl/site.tar.gz ]; then
  mkdir -p /tmp/site-axolotl && tar xzf .devsite/axolotl/site.tar.gz -C /tmp/site-axolotl
elif [ ! -d /tmp/site-axolotl/axolotl ] && [ "$size" = full ]; then
  echo "axolotl: .devsite/axolotl/site.tar.gz missing: run benchmarks/gpu/pack-axolotl.sh first"; exit 2
fi
started=$(date +%s)
model=/tmp/standins/olmo-3-7b-$size
python3 tests/standins.py make olmo-3-7b --size "$size" --weights --out "$model" 2>&1 | tail -1  # machine's transformers
echo "stand-in: $(( $(date +%s) - started )) s" | tee "$out/stages.txt"
export PYTHONPATH=/tmp/site-axolotl:$PYTHONPATH AXOLOTL_DO_NOT_TRACK=1
python3 -c "import axolotl, transformers, trl, peft, mlflow, papermill; print('axolotl', axolotl.__version__, 'transformers', transformers.__version__, 'trl', trl.__version__, 'peft', peft.__version__, 'mlflow', mlflow.__version__)" | tee "$out/versions.txt"
gpus=$(python3 -c "import torch; print(max(torch.cuda.device_count(), 1))")
nb() {  # nb NAME GPUS [extra papermill args]
  local name=$1 n=$2 begun=$(date +%s); shift 2
  python3 -m papermill -k python3 --execution-timeout 600 --no-progress-bar notebooks/axolotl/ddp_olmo3_7b.ipynb \
    "$out/$name.ipynb" -p output_dir "/tmp/axolotl_runs/$name" -p num_gpus "$n" -p base_model "$model" \
    -y "datasets: [{path: $PWD/data/alpaca_messages/train.jsonl, type: chat_template}]" -p max_steps "$steps" \
    -p save_steps 4 "$@" > "$out/$name.log" 2>&1
  echo "$name: rc=$? in $(( $(date +%s) - begun )) s" | tee -a "$out/stages.txt"
  cp "/tmp/axolotl_runs/$name/metrics.json" "$out/$name.json" 2>/dev/null
  cp "/tmp/axolotl_runs/$name/config.yml" "$out/$name.config.yml" 2>/dev/null
}
nb lora_1gpu 1
[ "$gpus" -ge 2 ] && nb lora_2gpu 2
[ "${QLORA:-0}" = 1 ] && nb "qlora_${gpus}gpu" "$gpus" -p load_in_4bit True
python3 - "$out" <<'PY'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
runs = {p.stem: json.loads(p.read_text()) for p in sorted(out.glob("*lora_[12]gpu.json"))}
gib = lambda b: None if b is None else round(b / 2**30, 2)
summary = {name: {"world_size": r["world_size"], "tokens_per_s": r["tokens_per_s"],
                  "tokens": {"total": r.get("total_tokens"), "trainable": r.get("trainable_tokens")},
                  "peak_memory_gib_per_gpu": [gib(b) for b in r["peak_memory_bytes"]],
                  "loss": [r["initial_loss"], r["final_loss"]], "eval_loss": (r.get("eval_losses") or [None])[-1]}
           for name, r in runs.items()}
if "lora_1gpu" in runs and "lora_2gpu" in runs:
    summary["lora_scaling_1_to_2"] = runs["lora_2gpu"]["tokens_per_s"] / runs["lora_1gpu"]["tokens_per_s"]
(out / "summary.json").write_text(json.dumps(summary, indent=2))
print(json.dumps(summary, indent=2))
PY
rm -rf "$model" /tmp/axolotl_runs
