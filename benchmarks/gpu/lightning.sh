#!/usr/bin/env bash
# Issue 8 evidence on the GPU machine: the Lightning DDP two-tower notebook's training samples/s on
# 1 GPU and on 2, side by side in one run, at the same batch per GPU (see lightning.md).
# Run from the repository root (benchmarks/gpu/run.sh lightning sets RESULTS and PYTHONPATH).
# The sizes can be overridden (e.g. to try the script on a CPU machine): LIGHTNING_BENCH_USERS, _ITEMS,
# _PER_USER (ratings generated), _BATCH (per GPU), _EPOCHS, _WORKERS (DataLoader workers per rank).
set -euo pipefail
: "${RESULTS:?set RESULTS to the folder that collects the results}"
out=$RESULTS/lightning
work=$(mktemp -d)
mkdir -p "$out"
export PYTHONPATH=$PWD:${PYTHONPATH:-}
users=${LIGHTNING_BENCH_USERS:-30000}
items=${LIGHTNING_BENCH_ITEMS:-10000}
per_user=${LIGHTNING_BENCH_PER_USER:-100}
batch=${LIGHTNING_BENCH_BATCH:-65536}
epochs=${LIGHTNING_BENCH_EPOCHS:-2}
workers=${LIGHTNING_BENCH_WORKERS:-4}

python3 - <<'PY'
import importlib.util, sys
need = ("papermill", "ipykernel", "pandas", "mlflow", "lightning", "torchmetrics", "matplotlib", "cloudpickle", "psutil")
missing = [name for name in need if importlib.util.find_spec(name) is None]
if missing:
    sys.exit(f"lightning.sh: not importable here: {missing}. Carry them (benchmarks/gpu/pack-site.sh notebook, "
             "benchmarks/gpu/pack-extra.sh) and put them on PYTHONPATH.")
PY

started=$(date +%s)
python3 data/make_ratings.py --users "$users" --items "$items" --ratings-per-user "$per_user" --out "$work/item_ratings.csv"
echo "ratings generated in $(( $(date +%s) - started )) s"

for gpus in 1 2; do
  started=$(date +%s)
  python3 -m papermill notebooks/lightning/ddp_two_tower.ipynb "$out/gpus$gpus.ipynb" --cwd notebooks/lightning \
    --no-progress-bar --execution-timeout 300 \
    -p output_dir "$work/gpus$gpus" -p num_gpus "$gpus" -p dataset_name "$work/item_ratings.csv" -p max_ratings 0 \
    -p per_device_train_batch_size "$batch" -p num_train_epochs "$epochs" -p dataloader_num_workers "$workers"
  cp "$work/gpus$gpus/metrics.json" "$out/gpus$gpus.json"
  echo "$gpus GPU(s): notebook ran in $(( $(date +%s) - started )) s"
done

python3 - "$out" "$batch" <<'PY'
import json, sys
out, batch = sys.argv[1], sys.argv[2]
one, two = (json.load(open(f"{out}/gpus{n}.json")) for n in (1, 2))
summary = {
    "what": "Lightning DDP two-tower notebook, training samples/s (Lightning's ThroughputMonitor: the median window of "
            "10 batches, times the ranks), 1 GPU vs 2",
    "batch_size_per_gpu": int(batch),
    "samples_per_s_1gpu": one["samples_per_s"],
    "samples_per_s_2gpu": two["samples_per_s"],
    "speedup": two["samples_per_s"] / one["samples_per_s"],
    "goal_speedup": 1.8,
    "peak_memory_bytes": {"1gpu": one["peak_memory_bytes"], "2gpu": two["peak_memory_bytes"]},
    "test_auroc": {"1gpu": one["test_auroc"], "2gpu": two["test_auroc"]},
    "devices": two["environment"]["devices"],
    "versions": two["environment"]["versions"],
    "date": two["environment"]["date"],
}
summary["goal_met"] = summary["speedup"] >= summary["goal_speedup"]
json.dump(summary, open(f"{out}/summary.json", "w"), indent=2)
print(json.dumps({k: summary[k] for k in ("samples_per_s_1gpu", "samples_per_s_2gpu", "speedup", "goal_met")}))
PY
rm -rf "$work"
