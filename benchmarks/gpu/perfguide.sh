#!/usr/bin/env bash
# Issue 24 evidence, since issue 44 in two notebooks: notebooks/02_fast_steps.ipynb and
# notebooks/03_surviving_failures.ipynb through papermill on one GPU with the full-size Llama-3.2-1B stand-in
# (published dimensions, random weights; speed and memory do not depend on them), 4 x 2048 tokens per step.
# 02: the knob table (bf16/fp32, torch.compile with inductor, activation checkpointing, 2x batch, DataLoader workers;
# with 2+ GPUs also reshard_after_forward and DDP) and the baseline's profiled step and MFU. 03: checkpoint
# save/load seconds of the 1B model with its AdamW states (~15 GB), the failure demo (the last rank raises at step 6)
# and the rerun that resumes from step 4, the hang demos, torchrun --max-restarts. About 4-5 minutes on one H200
# (run it with TOPIC_TIMEOUT=540); needs papermill (pack-site.sh notebook).
#   RESULTS=/tmp/results bash benchmarks/gpu/perfguide.sh          # through benchmarks/gpu/run.sh perfguide
# CPU dry run of the same script (tiny stand-in, small sizes, 2 CPU processes):
#   PERFGUIDE_DRY_RUN=1 RESULTS=/tmp/r bash benchmarks/gpu/perfguide.sh
# Writes $RESULTS/perfguide/: each executed notebook, its metrics.json (NAME_metrics.json) and log, knobs.png, rank 0's
# profiler trace (gzipped; Perfetto and TensorBoard read it) and table, and summary.txt (the figures for the
# notebooks' headers and the README).
set -euo pipefail
: "${RESULTS:?set RESULTS to the folder that receives the results}"
OUT="$RESULTS/perfguide"
WORK="${WORK:-$(mktemp -d)}"
PYTHON="${PYTHON:-python3}"
mkdir -p "$OUT" "$WORK"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" MPLBACKEND=Agg PYTHONUNBUFFERED=1
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1

if [ -n "${PERFGUIDE_DRY_RUN:-}" ]; then
  size=tiny device=cpu
  shared=(-p max_length 64 -p per_device_train_batch_size 2)
  fast=(-p timing_warmup_steps 1 -p timed_steps 2 -p dataloader_num_workers 1)
  failures=(-p learning_rate 0.001)
else
  size=full device=cuda:0
  shared=(-p num_gpus 1 -p max_length 2048 -p per_device_train_batch_size 4)
  fast=(-p timing_warmup_steps 2 -p timed_steps 5 -p dataloader_num_workers 4)
  failures=(-p learning_rate 0.00001)
fi

started=$SECONDS
stamp() { echo "[perfguide.sh +$((SECONDS - started))s] $*"; }
stamp "stand-in: llama-3.2-1b ($size) on $device"
"$PYTHON" tests/standins.py make llama-3.2-1b --size "$size" --weights --device "$device" --out "$WORK/llama-3.2-1b"

notebook() {  # notebook NAME PAPERMILL_ARGS...: notebooks/NAME.ipynb into $OUT, its run folder $WORK/NAME
  local name=$1; shift
  stamp "$name"
  "$PYTHON" -m papermill --no-progress-bar --log-output --execution-timeout 600 \
    "notebooks/$name.ipynb" "$OUT/$name.ipynb" -p output_dir "$WORK/$name" -p model_name_or_path "$WORK/llama-3.2-1b" \
    "${shared[@]}" "$@" > "$OUT/$name.log" 2>&1 || { tail -n 80 "$OUT/$name.log"; exit 1; }
  cp "$WORK/$name/metrics.json" "$OUT/${name}_metrics.json"
}
guides=" ${PERFGUIDE_NOTEBOOKS:-02_fast_steps 03_surviving_failures} "  # one of them: e.g. PERFGUIDE_NOTEBOOKS=02_fast_steps
if [[ $guides == *" 02_fast_steps "* ]]; then
  notebook 02_fast_steps "${fast[@]}"
  cp "$WORK/02_fast_steps/knobs.png" "$WORK/02_fast_steps/profile/rank0.txt" "$OUT/"
  gzip -c "$WORK/02_fast_steps/profile/rank0.pt.trace.json" > "$OUT/rank0.pt.trace.json.gz"
fi
[[ $guides == *" 03_surviving_failures "* ]] && notebook 03_surviving_failures -p max_steps 10 -p save_steps 4 "${failures[@]}"

stamp "summary"
"$PYTHON" - "$OUT/02_fast_steps_metrics.json" "$OUT/03_surviving_failures_metrics.json" <<'PY' | tee "$OUT/summary.txt"
import json, sys
from pathlib import Path
fast, failures = (json.loads(Path(path).read_text()) if Path(path).is_file() else None for path in sys.argv[1:])
if fast:
    print(f"{fast['environment']['devices'][0]}, {fast['world_size']} rank(s), {fast['environment']['date']}: "
          f"{fast['tokens_per_s']:,.0f} tokens/s" + (f", MFU {fast['mfu']:.1%}" if fast["mfu"] else ""))
    for row in fast["knobs"]:
        if not row["fits"]:
            print(f"  {row['change']:42s} does not fit in the GPU's memory (CUDA out of memory)")
            continue
        gib = row["peak_memory_gib"]
        peak = f"{gib:6.1f} GiB" if gib is not None and gib == gib else "-"  # None or NaN: a CPU
        print(f"  {row['change']:42s} {row['tokens_per_s']:10,.0f} tokens/s  x{row['vs_baseline']:.2f}  peak {peak}  "
              f"warm-up {row['warmup_s']:.1f} s")
if failures:
    print(f"checkpoint {failures['checkpoint_bytes'] / 2**30:.1f} GiB: save {failures['checkpoint_save_s']:.1f} s, "
          f"load {failures['checkpoint_load_s']:.1f} s")
    print(f"resumed run vs uninterrupted: largest loss difference "
          f"{max(abs(a - b) for a, b in zip(failures['losses'], failures['resumed_losses'])):.2e}")
PY
stamp "done; results in $OUT"
