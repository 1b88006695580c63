#!/usr/bin/env bash
# Evidence on ONE GPU (issues 16, 17, 18): about 4 to 5 minutes on one H200.
#   1. Every notebook of the PyTorch-native set runs through papermill with num_gpus=1 and its defaults, apart
#      from output_dir, data where the default is not on the machine (COCO, GroupLens' download) and fewer steps
#      where the default takes long: 00_getting_started, ddp_mlp, fsdp2_transformer (300 of 1000 steps, then
#      rerun to 400: a resume on the GPU), ddp_retinanet (60 steps on the coloured-shapes set at 128 px),
#      ddp_two_tower (100k generated ratings), choose_your_technique.
#   2. Issue 17's check that the refactor changed nothing: ddp_mlp as of commit 9f76f1e and as now, one after
#      the other on the same GPU with the same settings (defaults, 20 epochs): same loss curve, samples/s.
#   3. MLflow: every run above goes into one store (runs/mlflow.db, the project's default); its summary lists
#      each run's params, metrics (system/gpu_* where MLflow can read the GPU: nvidia-ml-py) and models.
# The old notebook comes from git (`git show 9f76f1e:notebooks/pytorch/ddp_mlp.ipynb`); where the copy of the
# repository has no .git, put that file at OLD_MLP (default: ./ddp_mlp_9f76f1e.ipynb) before the call.
# Run from the repository root (benchmarks/gpu/run.sh one_gpu sets RESULTS and PYTHONPATH). Writes
# $RESULTS/one_gpu/: NAME.json (each run's metrics.json), NAME.ipynb (executed), NAME.log, runs.tsv (name, exit
# code, seconds), mlflow.json, ddp_mlp_old_vs_new.json. DRY_RUN=1 runs the same steps with tiny sizes on a CPU.
set -uo pipefail
: "${RESULTS:?set RESULTS to the folder that collects the results}"
out=$RESULTS/one_gpu
work=${WORK:-$(mktemp -d)}
runs=$work/runs  # one project: the MLflow store is runs/mlflow.db
mkdir -p "$out" "$runs"
export PYTHONPATH=$PWD:${PYTHONPATH:-} MPLBACKEND=Agg PYTHONUNBUFFERED=1
PYTHON=${PYTHON:-python3}
OLD_MLP=${OLD_MLP:-ddp_mlp_9f76f1e.ipynb}
if [ "${DRY_RUN:-0}" = 1 ]; then  # a CPU check of the script itself: the same runs, tiny
  MLP=(-p num_samples 4096 -p num_train_epochs 2); OLD_MLP_SIZES=(-p num_samples 4096 -p epochs 2)
  FSDP=(-p num_hidden_layers 2 -p hidden_size 64 -p num_attention_heads 4 -p intermediate_size 256 -p max_length 32
        -p num_samples 1024 -p num_eval_samples 64 -p per_device_train_batch_size 16 -p save_steps 3)
  FSDP_STEPS=(6 8); RN=(-p min_size 64 -p max_size 64 -p per_device_train_batch_size 2 -p max_steps 3
                        -p max_eval_samples 2 -p dataloader_num_workers 0 -p timing_warmup_steps 1)
  IMAGES=(--train 64 --val 8 --image-size 64); RATINGS=(--users 100 --items 50 --ratings-per-user 20)
  LIGHTNING=(-p num_train_epochs 1 -p dataloader_num_workers 0 -p timing_warmup_steps 1)
else
  MLP=(); OLD_MLP_SIZES=()
  FSDP=(); FSDP_STEPS=(300 400); RN=(-p min_size 128 -p max_size 128 -p per_device_train_batch_size 32 -p max_steps 60
                                     -p max_eval_samples 64)
  IMAGES=(--train 1024 --val 64 --image-size 128); RATINGS=(--users 1000 --items 1000 --ratings-per-user 110)
  LIGHTNING=()
fi

"$PYTHON" - <<'PY' | tee "$out/environment.txt"
import importlib.util, sys
def missing(names):
    return [name for name in names if importlib.util.find_spec(name) is None]
if missing(needed := ("torch", "mlflow", "sqlalchemy", "alembic", "matplotlib", "papermill", "ipykernel")):
    sys.exit(f"one_gpu.sh: not importable here: {missing(needed)}. Carry them (benchmarks/gpu/pack-site.sh notebook, "
             "benchmarks/gpu/pack-extra.sh) and put them on PYTHONPATH.")
if missing(wanted := ("torchvision", "pycocotools", "lightning", "torchmetrics", "pandas", "transformers")):
    print(f"one_gpu.sh: not importable here: {missing(wanted)}; the notebooks that need them will fail, the rest run")
import torch
print("gpus", torch.cuda.device_count(), [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())])
print("nvidia-ml-py (MLflow's GPU system metrics):", importlib.util.find_spec("pynvml") is not None)
PY
[ $? -eq 0 ] || exit 1

started=$SECONDS
printf "name\texit_code\tseconds\n" > "$out/runs.tsv"
pm() {  # NAME NOTEBOOK [-p KEY VALUE ...]: the notebook into runs/NAME (a later -p output_dir wins); metrics.json as NAME.json
  local name=$1 notebook=$2 t0=$SECONDS rc; shift 2
  echo "[one_gpu.sh +$((SECONDS - started))s] $name"
  "$PYTHON" -m papermill --no-progress-bar --log-output --execution-timeout 300 "$notebook" "$out/$name.ipynb" \
    -p output_dir "$runs/$name" "$@" > "$out/$name.log" 2>&1
  rc=$?
  printf "%s\t%s\t%s\n" "$name" "$rc" "$((SECONDS - t0))" >> "$out/runs.tsv"
  [ $rc -eq 0 ] || tail -n 30 "$out/$name.log"
  cp "$runs/$name/metrics.json" "$out/$name.json" 2>/dev/null
}

# 2. old and new DDP MLP first, on a GPU nothing else has used yet
if [ ! -f "$OLD_MLP" ] && git rev-parse --git-dir > /dev/null 2>&1; then
  git show 9f76f1e:notebooks/pytorch/ddp_mlp.ipynb > "$work/ddp_mlp_9f76f1e.ipynb" && OLD_MLP=$work/ddp_mlp_9f76f1e.ipynb
fi
if [ -f "$OLD_MLP" ]; then
  pm ddp_mlp_old "$OLD_MLP" -p num_gpus 1 "${OLD_MLP_SIZES[@]}"
else
  echo "one_gpu.sh: no $OLD_MLP and no git: the old ddp_mlp is left out" | tee -a "$out/runs.tsv"
fi
pm ddp_mlp notebooks/pytorch/ddp_mlp.ipynb -p num_gpus 1 "${MLP[@]}"

# 1. every notebook with one GPU
pm getting_started notebooks/00_getting_started.ipynb -p num_gpus 1
pm fsdp2_transformer notebooks/pytorch/fsdp2_transformer.ipynb -p num_gpus 1 "${FSDP[@]}" -p max_steps "${FSDP_STEPS[0]}"
pm fsdp2_transformer_resumed notebooks/pytorch/fsdp2_transformer.ipynb -p num_gpus 1 "${FSDP[@]}" -p max_steps "${FSDP_STEPS[1]}" \
   -p output_dir "$runs/fsdp2_transformer"  # the same output_dir again, further: resumes from its last checkpoint
cp "$runs/fsdp2_transformer/metrics.json" "$out/fsdp2_transformer_resumed.json" 2>/dev/null
"$PYTHON" data/make_detection.py --out "$work/shapes" "${IMAGES[@]}" > /dev/null
pm ddp_retinanet notebooks/pytorch/ddp_retinanet.ipynb -p num_gpus 1 -p dataset_name "$work/shapes" "${RN[@]}"
"$PYTHON" data/make_ratings.py --out "$work/item_ratings.csv" "${RATINGS[@]}" > /dev/null
pm ddp_two_tower notebooks/lightning/ddp_two_tower.ipynb -p num_gpus 1 -p dataset_name "$work/item_ratings.csv" "${LIGHTNING[@]}"
pm choose_your_technique notebooks/choose_your_technique.ipynb  # no GPU: shapes on the meta device

echo "[one_gpu.sh +$((SECONDS - started))s] summaries"
"$PYTHON" benchmarks/gpu/one_gpu_summary.py "$out" "sqlite:///$runs/mlflow.db" | tee "$out/summary.txt"
[ -n "${WORK:-}" ] || rm -rf "$work"
