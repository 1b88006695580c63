#!/usr/bin/env bash
# Issue 24 evidence: notebooks/performance_and_resilience.ipynb through papermill on one GPU with the full-size
# Llama-3.2-1B stand-in (published dimensions, random bf16 weights; speed and memory do not depend on them),
# 4 x 2048 tokens per step: the profile of one FSDP2 step and MFU, the knob table (bf16/fp32, torch.compile with
# inductor, activation checkpointing, 2x batch, reshard_after_forward, DDP, DataLoader workers) with the planner's
# estimates, checkpoint save/load seconds of the 1B model with its AdamW states (~15 GB), the failure demo (the
# last rank raises at step 6) and the rerun that resumes from step 4, torchrun --max-restarts. About 4-5 minutes on
# one H200 (run it with TOPIC_TIMEOUT=540); needs papermill and datasets (pack-site.sh notebook trl).
#   RESULTS=/tmp/results bash benchmarks/gpu/perfguide.sh          # through benchmarks/gpu/run.sh perfguide
# CPU dry run of the same script (tiny stand-in, small sizes, 2 CPU processes):
#   PERFGUIDE_DRY_RUN=1 RESULTS=/tmp/r bash benchmarks/gpu/perfguide.sh
# Writes $RESULTS/perfguide/: the executed notebook, metrics.json, the two plots, rank 0's profiler trace
# (gzipped; Perfetto and TensorBoard read it) and summary.txt (the figures for the notebook's header and the README).
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
  sizes=(-p max_length 64 -p per_device_train_batch_size 2 -p timing_warmup_steps 1 -p timed_steps 2
         -p dataloader_num_workers 1 -p torch_compile_backend aot_eager -p learning_rate 0.001)
else
  size=full device=cuda:0
  sizes=(-p num_gpus 1 -p max_length 2048 -p per_device_train_batch_size 4 -p timing_warmup_steps 2 -p timed_steps 5
         -p dataloader_num_workers 4 -p torch_compile_backend inductor -p learning_rate 0.00001)
fi

started=$SECONDS
stamp() { echo "[perfguide.sh +$((SECONDS - started))s] $*"; }
stamp "stand-in: llama-3.2-1b ($size) on $device"
"$PYTHON" tests/standins.py make llama-3.2-1b --size "$size" --weights --device "$device" --out "$WORK/llama-3.2-1b"

stamp "the notebook"
"$PYTHON" -m papermill --no-progress-bar --log-output --execution-timeout 600 \
  notebooks/performance_and_resilience.ipynb "$OUT/performance_and_resilience.ipynb" \
  -p output_dir "$WORK/run" -p model_name_or_path "$WORK/llama-3.2-1b" -p dataset_name "$PWD/data/alpaca" \
  -p max_steps 10 -p save_steps 4 -p crash_at_step 6 "${sizes[@]}" > "$WORK/papermill.log" 2>&1 \
  || { tail -n 80 "$WORK/papermill.log"; cp "$WORK/papermill.log" "$OUT/"; exit 1; }
cp "$WORK/papermill.log" "$WORK/run/metrics.json" "$WORK/run/where_the_time_goes.png" "$WORK/run/knobs.png" "$OUT/"
gzip -c "$WORK/run/profile/rank0.pt.trace.json" > "$OUT/rank0.pt.trace.json.gz"

stamp "summary"
"$PYTHON" - "$OUT/metrics.json" <<'PY' | tee "$OUT/summary.txt"
import json, sys
m = json.load(open(sys.argv[1]))
print(f"{m['device']}, {m['world_size']} rank(s), {m['environment']['date']}: {m['tokens_per_s']:,.0f} tokens/s"
      + (f", MFU {m['mfu']:.1%}" if m["mfu"] else ""))
print("where the time goes (ms, rank 0):", {k: round(v, 1) for k, v in m["time_ms"]["rank 0"].items()})
for row in m["knobs"]:
    planner = f"{row['planner_gib']:.1f}" if row["planner_gib"] is not None else "-"
    print(f"  {row['change']:42s} {row['tokens_per_s']:10,.0f} tokens/s  x{row['vs_baseline']:.2f}  "
          f"peak {row['peak_memory_gib']:6.1f} GiB (planner {planner})  warm-up {row['warmup_s']:.1f} s")
print(f"checkpoint {m['checkpoint_bytes'] / 2**30:.1f} GiB: save {m['checkpoint_save_s']:.1f} s, load {m['checkpoint_load_s']:.1f} s, "
      f"step {m['step_s']:.3f} s; cadence {[(c['save_steps'], round(c['share_of_run_time'], 4)) for c in m['checkpoint_cadence']]}")
print(f"failure demo: rank {m['failed_rank']} failed; resumed from step {m['resumed_from_step']}; largest loss difference "
      f"to the uninterrupted run {m['resumed_vs_uninterrupted_max_loss_difference']:.2e}")
print(f"torchrun --max-restarts=1: exit code {m['torchrun_exit_code']}, attempts that finished {m['torchrun_attempts_done']}")
PY
stamp "done; results in $OUT"
