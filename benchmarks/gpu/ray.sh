#!/usr/bin/env bash
# Issue 10 evidence on the GPU machine (see ray.md): both Ray Train recipes on 1 worker and on every GPU when there are
# more (images/s, tokens/s, peak memory), and @distributed(engine="ray") with NCCL across the GPUs.
# RAY_RECIPES="resnet50 qwen" (default) picks the recipes; QWEN_GRADIENT_CHECKPOINTING="null false true" runs the
# Qwen2.5 recipe as it defaults (null: the planner decides, its verdict in the log), without activation checkpointing
# (..._nockpt) and with it (..._ckpt), for the memory and speed side by side.
# Needs `python3 -c "import ray"` to work (ray is carried as a site dir). Results: $RESULTS/ray/.
# Each run has its own storage path: Ray Train resumes a run of the same name found there.
# Sizes can be shrunk to test the logic on CPU, e.g.
#   RAY_ADDRESS=127.0.0.1:PORT QWEN_SIZE=tiny SEQ=64 IMAGES_PER_CLASS=8 IMAGE_SIZE=32 RESNET_BATCH=8 bash benchmarks/gpu/ray.sh
set -uo pipefail
out=$RESULTS/ray
mkdir -p "$out"
work=$(mktemp -d /tmp/raybench.XXXXXX)
QWEN_SIZE=${QWEN_SIZE:-full}            # the published Qwen2.5-3B dimensions, random weights
SEQ=${SEQ:-1024}
QWEN_STEPS=${QWEN_STEPS:-12}            # tokens/s timed over steps 3-12
IMAGES_PER_CLASS=${IMAGES_PER_CLASS:-192}
IMAGE_SIZE=${IMAGE_SIZE:-224}
RESNET_BATCH=${RESNET_BATCH:-64}
LOADER_WORKERS=${LOADER_WORKERS:-8}
RAY_RECIPES=${RAY_RECIPES:-resnet50 qwen}
QWEN_GRADIENT_CHECKPOINTING=${QWEN_GRADIENT_CHECKPOINTING:-null}
gpus=$(python3 -c "import torch; print(torch.cuda.device_count())")
WORKER_COUNTS=${WORKER_COUNTS:-$( [ "$gpus" -gt 1 ] && echo "1 $gpus" || echo 1 )}  # a Ray Train worker per GPU
export RAY_USAGE_STATS_ENABLED=0 RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0
begin=$(date +%s)
say() { echo "[$(( $(date +%s) - begin )) s] $*"; }

own_ray=0
if [ -z "${RAY_ADDRESS:-}" ]; then  # one Ray instance for every run here (a run would otherwise start its own)
  ray start --head --port=6379 --node-ip-address=127.0.0.1 --include-dashboard=false --disable-usage-stats \
    --object-store-memory=4000000000 > "$out/ray_start.log" 2>&1 || { cat "$out/ray_start.log"; exit 1; }
  export RAY_ADDRESS=127.0.0.1:6379
  own_ray=1
fi
say "ray up at $RAY_ADDRESS"

[[ " $RAY_RECIPES " == *" resnet50 "* ]] && python3 data/make_image_folders.py "$work/images" \
  --train-per-class "$IMAGES_PER_CLASS" --val-per-class 16 --size $(( IMAGE_SIZE * 8 / 7 )) > "$out/images.log" 2>&1 &
[[ " $RAY_RECIPES " == *" qwen "* ]] && python3 tests/standins.py make qwen2.5-3b --size "$QWEN_SIZE" --weights \
  --out "$work/qwen" > "$out/standin.log" 2>&1 &
wait
say "data and stand-in ready: $(tail -qn 1 "$out/images.log" "$out/standin.log" 2>/dev/null | tr '\n' ' ')"

for n in $WORKER_COUNTS; do
  [[ " $RAY_RECIPES " == *" resnet50 "* ]] || break
  python3 recipes/ray_resnet50/train.py --dataset_name "$work/images" --weights none --num_train_epochs 2 \
    --per_device_train_batch_size "$RESNET_BATCH" --image_size "$IMAGE_SIZE" --dataloader_num_workers "$LOADER_WORKERS" \
    --num_workers $n --output_dir "$out/resnet50_${n}w" --storage_path "$work/ray_results_resnet50_${n}w" \
    > "$out/resnet50_${n}w.log" 2>&1
  say "resnet50 on $n worker(s): rc=$? $(grep '^final' "$out/resnet50_${n}w.log")"
done

for checkpointing in $QWEN_GRADIENT_CHECKPOINTING; do
  for n in $WORKER_COUNTS; do
    [[ " $RAY_RECIPES " == *" qwen "* ]] || break 2
    name=qwen2_5_3b_${n}w; [ "$checkpointing" = true ] && name=${name}_ckpt; [ "$checkpointing" = false ] && name=${name}_nockpt
    python3 recipes/ray_qwen2_5_3b/train.py --model_name_or_path "$work/qwen" --dataset_name data/alpaca --max_length "$SEQ" \
      --max_steps "$QWEN_STEPS" --logging_steps 6 --save_steps 0 --timing_warmup_steps 2 --save_final_model false --num_workers $n \
      --gradient_checkpointing "$checkpointing" --output_dir "$out/$name" --storage_path "$work/ray_results_$name" \
      > "$out/$name.log" 2>&1
    say "qwen2.5-3b on $n worker(s), gradient_checkpointing $checkpointing: rc=$? $(grep '^final' "$out/$name.log")"
  done
done

# @distributed(engine="ray"): every GPU of the cluster, NCCL all-reduce, the placement env of each rank.
python3 - "$out/engine_nccl.json" > "$out/engine_nccl.log" 2>&1 <<'PY'
import json, os, sys, time
import ray, torch, torch.distributed as dist
from nbhelpers import distributed, backend, device

ray.init(address=os.environ["RAY_ADDRESS"])

@distributed(engine="ray")
def check():
    torch.cuda.set_device(device()) if torch.cuda.is_available() else None
    dist.init_process_group(backend())
    x = torch.full((64 * 2**20,), float(dist.get_rank() + 1), device=device())  # 256 MB of fp32
    dist.all_reduce(x)
    torch.cuda.synchronize() if torch.cuda.is_available() else None
    started = time.perf_counter()
    for _ in range(5):
        dist.all_reduce(x)
    torch.cuda.synchronize() if torch.cuda.is_available() else None
    seconds = (time.perf_counter() - started) / 5
    n = dist.get_world_size()
    keys = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "CUDA_VISIBLE_DEVICES")
    result = {k: os.environ.get(k) for k in keys}
    result.update(backend=dist.get_backend(), device=str(device()),
                  device_name=torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
                  first_value_after_6_sums=x[0].item(), bus_bandwidth_gb_s=x.numel() * 4 * 2 * (n - 1) / n / seconds / 1e9)
    print(f"rank {result['RANK']}: {result['device']} ({result['device_name']}), {result['bus_bandwidth_gb_s']:.0f} GB/s bus")
    dist.destroy_process_group()
    return result

started = time.perf_counter()
results = check.distributed()
json.dump({"launch_and_run_s": time.perf_counter() - started, "ranks": results}, open(sys.argv[1], "w"), indent=2)
print(json.dumps(results))
PY
say "engine check: rc=$? $(tail -n 1 "$out/engine_nccl.log" | cut -c1-300)"

python3 - "$out" <<'PY'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])

def load(name):
    path = out / name / "metrics.json"
    return json.loads(path.read_text()) if path.exists() else None

summary = {}
for recipe, metric in (("resnet50", "images_per_s"), ("qwen2_5_3b", "tokens_per_s")):
    for variant in ("", "_ckpt"):  # _ckpt: with activation checkpointing (Qwen2.5 only)
        runs = {int(p.name[len(recipe) + 1:].split("w")[0]): load(p.name)
                for p in sorted(out.glob(f"{recipe}_*w{variant}")) if p.is_dir() and p.name.endswith(f"w{variant}")}
        if not runs:
            continue
        row = {f"{metric}_{n}w": (m or {}).get(metric) for n, m in runs.items()}
        row.update({f"final_loss_{n}w": (m or {}).get("final_loss") for n, m in runs.items()})
        if recipe == "qwen2_5_3b":
            row.update({f"peak_memory_gib_{n}w": m["peak_memory_bytes"] / 2**30 if (m or {}).get("peak_memory_bytes") else None
                        for n, m in runs.items()})
        counts = sorted(runs)
        if len(counts) > 1 and row[f"{metric}_1w"] and row[f"{metric}_{counts[-1]}w"]:
            row[f"scaling_{counts[-1]}w_over_1w"] = row[f"{metric}_{counts[-1]}w"] / row[f"{metric}_1w"]
        summary[recipe + variant] = row
engine = out / "engine_nccl.json"
summary["engine_nccl"] = json.loads(engine.read_text()) if engine.exists() else None
(out / "summary.json").write_text(json.dumps(summary, indent=2))
print(json.dumps(summary, indent=2))
PY

[ "$own_ray" = 1 ] && ray stop --force > /dev/null 2>&1
rm -rf "$work"
say "done"
