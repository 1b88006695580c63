#!/usr/bin/env bash
# GPU evidence for the PyTorch-native notebooks (issue 4), side by side in one run on one node:
#   1. RetinaNet (DDP) images/s on 1 GPU, then on 2 GPUs: scaling efficiency = ips(2) / (2 * ips(1)).
#   2. FSDP2 Transformer samples/s, peak memory and sharded state per GPU on 1 GPU, then on 2 GPUs.
#   3. The 2-GPU RetinaNet run is the long one: it trains from scratch on the coloured-shapes set
#      (data/make_detection.py) and reports validation mAP before training (untrained) and after.
# Each run is the notebook itself, executed with papermill. Runs go one after the other, so no run
# shares the host with another. Run from the repository root:
#   RESULTS=/tmp/results bash benchmarks/gpu/pytorch.sh
# Writes $RESULTS/pytorch/{retinanet_1gpu,retinanet_2gpu,fsdp2_1gpu,fsdp2_2gpu}.json (each run's
# metrics.json) and $RESULTS/pytorch/summary.json (the comparison). Knobs (environment): see below.
set -euo pipefail
: "${RESULTS:?set RESULTS to the folder that receives the result JSONs}"
OUT="$RESULTS/pytorch"
WORK="${WORK:-$(mktemp -d)}"
PYTHON="${PYTHON:-python3}"
RN_STEPS_1GPU="${RN_STEPS_1GPU:-60}"      # short: throughput only
RN_STEPS_2GPU="${RN_STEPS_2GPU:-400}"     # long: throughput and mAP
RN_BATCH="${RN_BATCH:-32}"                # images per GPU per step
FSDP_STEPS="${FSDP_STEPS:-60}"
FSDP_BATCH="${FSDP_BATCH:-64}"            # sequences of 128 tokens per GPU per step
TRAIN_IMAGES="${TRAIN_IMAGES:-4096}"
VAL_IMAGES="${VAL_IMAGES:-256}"
mkdir -p "$OUT" "$WORK"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" MPLBACKEND=Agg PYTHONUNBUFFERED=1
export HF_HUB_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1 AXOLOTL_DO_NOT_TRACK=1 RAY_USAGE_STATS_ENABLED=0

"$PYTHON" - <<'EOF'
import importlib.util, sys
missing = [m for m in ("torch", "torchvision", "pycocotools", "mlflow", "matplotlib", "tqdm", "papermill", "ipykernel")
           if importlib.util.find_spec(m) is None]
if missing:
    sys.exit(f"pytorch.sh: missing on this machine: {missing} (carry them on PYTHONPATH, e.g. with pack-site.sh)")
import torch
if torch.cuda.device_count() < 2:
    sys.exit(f"pytorch.sh: needs 2 GPUs, sees {torch.cuda.device_count()}")
EOF

started=$SECONDS
stamp() { echo "[pytorch.sh +$((SECONDS - started))s] $*"; }
run_notebook() {  # NOTEBOOK NAME [-p KEY VALUE ...]: run a notebook into $WORK/NAME, keep its metrics as $OUT/NAME.json
  local notebook=$1 name=$2; shift 2
  stamp "$name"
  "$PYTHON" -m papermill --no-progress-bar --log-output --execution-timeout 300 "$notebook" "$WORK/$name.ipynb" \
    -p output_dir "$WORK/$name" -p mlflow_tracking_uri "sqlite:///$WORK/mlflow.db" "$@" > "$WORK/$name.log" 2>&1 \
    || { tail -n 60 "$WORK/$name.log"; exit 1; }
  cp "$WORK/$name/metrics.json" "$OUT/$name.json"
}

stamp "generating $TRAIN_IMAGES + $VAL_IMAGES detection images (128 px)"
"$PYTHON" data/make_detection.py --out "$WORK/shapes" --train "$TRAIN_IMAGES" --val "$VAL_IMAGES" --image-size 128

RETINANET=(notebooks/pytorch/ddp_retinanet.ipynb)
RN_COMMON=(-p dataset_name "$WORK/shapes" -p min_size 128 -p max_size 128 -p per_device_train_batch_size "$RN_BATCH"
           -p learning_rate 0.02 -p warmup_steps 50 -p dataloader_num_workers 6 -p timing_warmup_steps 10 -p bf16 True
           -p save_steps 100000)  # one checkpoint, after the last step (outside the timed steps)
run_notebook "${RETINANET[@]}" retinanet_1gpu "${RN_COMMON[@]}" -p num_gpus 1 -p max_steps "$RN_STEPS_1GPU" -p max_eval_samples 64
run_notebook "${RETINANET[@]}" retinanet_2gpu "${RN_COMMON[@]}" -p num_gpus 2 -p max_steps "$RN_STEPS_2GPU" -p eval_on_start True

FSDP=(notebooks/pytorch/fsdp2_transformer.ipynb)
FSDP_COMMON=(-p max_steps "$FSDP_STEPS" -p per_device_train_batch_size "$FSDP_BATCH" -p warmup_steps 10
             -p timing_warmup_steps 10 -p save_steps 1000 -p bf16 True)
run_notebook "${FSDP[@]}" fsdp2_1gpu "${FSDP_COMMON[@]}" -p num_gpus 1
run_notebook "${FSDP[@]}" fsdp2_2gpu "${FSDP_COMMON[@]}" -p num_gpus 2

stamp "summary"
"$PYTHON" benchmarks/gpu/pytorch_summary.py "$OUT" | tee "$OUT/summary.txt"
stamp "done; results in $OUT"
