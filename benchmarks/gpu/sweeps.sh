#!/usr/bin/env bash
# Issue 19 evidence on the GPU machine (one H200 is enough; more GPUs show runs side by side):
#   1. gpu_type against the real GPUs: "H200" accepted, "A10" refused with both names (nvidia-smi).
#   2. notebooks/01_sweeps_and_remote.ipynb through papermill with its defaults: 4 learning rates of
#      num_gpus=1 each; on 1 GPU they queue, each on GPU 0; on N GPUs up to N run at once on disjoint GPUs.
#   3. The system metrics of one longer training run (NVML: GPU utilisation and memory; CPU, host memory),
#      returned by the launch and logged to its MLflow run.
# Run from the repository root (through benchmarks/gpu/run.sh, or directly):
#   RESULTS=/tmp/results bash benchmarks/gpu/sweeps.sh
# Writes $RESULTS/sweeps/{sweep.ipynb,sweep/metrics.json,sweep/sweep.png,one_run.ipynb,one_run/metrics.json,
# gpu_type.txt,summary.json}. SIZE=tiny runs the same steps with CPU-sized parameters (the dry run).
set -euo pipefail
: "${RESULTS:?set RESULTS to the folder that receives the results}"
OUT="$RESULTS/sweeps"
SIZE="${SIZE:-full}"
PYTHON="${PYTHON:-python3}"
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" MPLBACKEND=Agg PYTHONUNBUFFERED=1
export NBHELPERS_GPU_LEASE_DIR="$OUT/gpu-leases"  # this run's own leases (the default is host-wide /tmp)
pm() { "$PYTHON" -m papermill --execution-timeout 600 --no-progress-bar "$@"; }

"$PYTHON" - <<'EOF'
import importlib.util, sys
missing = [m for m in ("torch", "mlflow", "pandas", "matplotlib", "papermill", "ipykernel") if importlib.util.find_spec(m) is None]
if missing:
    sys.exit(f"sweeps.sh: missing on this machine: {missing} (carry them on PYTHONPATH, e.g. with pack-site.sh)")
if importlib.util.find_spec("pynvml") is None:
    print("sweeps.sh: no pynvml (nvidia-ml-py): the GPU system metrics will be null", file=sys.stderr)
EOF

if [[ $SIZE == tiny ]]; then
  sweep='{"learning_rates": [0.0003, 0.003, 0.3], "num_samples": 4096, "num_features": 16, "hidden_size": 64, "num_train_epochs": 4, "per_device_train_batch_size": 128}'
  one='{"learning_rates": [0.001], "num_samples": 8192, "num_features": 16, "hidden_size": 64, "num_train_epochs": 6, "per_device_train_batch_size": 128}'
else
  sweep='{}'  # the notebook's defaults: 4 learning rates, num_gpus=1
  one='{"learning_rates": [0.001], "num_samples": 1048576, "hidden_size": 4096, "num_train_epochs": 8, "per_device_train_batch_size": 4096}'
fi

"$PYTHON" - > "$OUT/gpu_type.txt" 2>&1 <<'EOF' || true
from nbhelpers import distributed
import nbhelpers.launch.gpus as engine
gpus = engine.visible_gpus()
print("visible:", gpus, engine._gpu_names(gpus) if gpus else "(none)")
for gpu_type in ("H200", "A10"):
    try:
        distributed(gpus=1, gpu_type=gpu_type)(print)
        print(f"gpu_type={gpu_type!r}: accepted")
    except ValueError as exc:
        print(f"gpu_type={gpu_type!r}: refused: {exc}")
EOF
cat "$OUT/gpu_type.txt"

started=$SECONDS
pm notebooks/01_sweeps_and_remote.ipynb "$OUT/sweep.ipynb" -p output_dir "$OUT/sweep" -y "$sweep" > "$OUT/sweep.log" 2>&1
echo "sweep: $((SECONDS - started)) s"
started=$SECONDS
pm notebooks/01_sweeps_and_remote.ipynb "$OUT/one_run.ipynb" -p output_dir "$OUT/one_run" -y "$one" > "$OUT/one_run.log" 2>&1
echo "one run: $((SECONDS - started)) s"

"$PYTHON" - "$OUT" <<'EOF'
import json, sys
out = sys.argv[1]
sweep, one = (json.load(open(f"{out}/{name}/metrics.json")) for name in ("sweep", "one_run"))
summary = {
    "devices": sweep["environment"]["devices"],
    "sweep": {k: sweep[k] for k in ("learning_rates", "final_losses", "gpus_used", "seconds", "runs_overlapped",
                                    "best_learning_rate", "samples_per_s", "mlflow_runs_listed")},
    "sweep_gpu_busy_percent": [m["gpu_utilization_percent_mean"] for m in sweep["system_metrics"]],
    "one_run_system_metrics": one["system_metrics"][0],
    "one_run_samples_per_s": one["samples_per_s"][0],
    "one_run_mlflow_system_metrics": one["mlflow_system_metrics"],
}
json.dump(summary, open(f"{out}/summary.json", "w"), indent=2)
print(json.dumps(summary, indent=2))
EOF
