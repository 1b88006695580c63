#!/usr/bin/env bash
# Issue 21 §1 evidence on one GPU: ResNet-50 fed by the Ray recipe's data paths, side by side in one run.
#   stage bench (default; nothing carried, no Ray): benchmarks/resnet_data.py writes 32,000 + 1,000 ImageNet-sized
#     JPEGs (~110 kB, ~0.2 MP) to local disk with every core, then trains the recipe's step at batch 256 fed by
#     (a) synthetic tensors on the GPU (the ceiling), (b) the old DataLoader path, (c) the nvJPEG device path,
#     (a) and (c) eager and compiled, and profiles (c)'s stages alone. About 3 minutes on one H200.
#   stage recipe (STAGES=recipe; ray carried as for ray.sh): recipes/ray_resnet50/train.py under Ray Train,
#     device pipeline, 2 epochs each, for each of RECIPE_MODES (default "eager torch_compile") on each of
#     RECIPE_WORKERS workers (default 1, and every GPU when there are more). About 4 minutes on one H200;
#     on 2 GPUs use RECIPE_MODES=torch_compile (1 and 2 workers: the scaling figure). The first run kills its last
#     worker once after training epoch KILL_AT_EPOCH (default 1; empty: no kill) and trains one epoch more than the
#     others, so Ray Train's restart and the resume from the epoch before are part of the evidence. With the bench stage
#     in the same call, the last line gives each recipe run's images/s as a share of the synthetic ceiling.
# Results: $RESULTS/ray/resnet_data.json, resnet_data_summary.txt (one line), logs; recipe runs in
# $RESULTS/ray/resnet50_data_*/metrics.json. A CPU dry run of the logic (seconds of training, no compile):
#   RESULTS=/tmp/r RESNET_DATA_DRY_RUN=1 bash benchmarks/gpu/resnet_data.sh
set -uo pipefail
out=$RESULTS/ray
mkdir -p "$out"
work=$(mktemp -d /tmp/resnetdata.XXXXXX)
STAGES=${STAGES:-bench}
begin=$(date +%s)
say() { echo "[$(( $(date +%s) - begin )) s] $*"; }
if [ "${RESNET_DATA_DRY_RUN:-0}" = 1 ]; then
  sizes=(--train_images 96 --val_images 24 --max_side 64 --image_size 32 --per_device_train_batch_size 8
         --timed_steps 3 --timing_warmup_steps 2 --dataloader_num_workers 2 --no-torch_compile)
  recipe_sizes=(--image_size 32 --per_device_train_batch_size 8 --weights none)
else
  sizes=(--train_images "${TRAIN_IMAGES:-32000}" --val_images 1000 --per_device_train_batch_size "${BATCH:-256}")
  recipe_sizes=(--image_size 224 --per_device_train_batch_size "${BATCH:-256}" --weights none)
fi

df -hT /tmp > "$out/resnet_data_disk.txt" 2>&1  # where the JPEGs live (a tmpfs would be RAM, like the page cache)
if [[ " $STAGES " == *" bench "* ]]; then
  python3 benchmarks/resnet_data.py --output_dir "$out" --data_dir "$work/images" "${sizes[@]}" > "$out/resnet_data.log" 2>&1
  say "bench: rc=$? $(cat "$out/resnet_data_summary.txt" 2>/dev/null || tail -n 3 "$out/resnet_data.log")"
fi

if [[ " $STAGES " == *" recipe "* ]]; then
  [ -d "$work/images/train" ] || python3 benchmarks/resnet_data.py --output_dir "$work" --data_dir "$work/images" \
    --data_only "${sizes[@]}" > "$out/resnet_data_images.log" 2>&1
  export RAY_USAGE_STATS_ENABLED=0 RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0
  own_ray=0
  if [ -z "${RAY_ADDRESS:-}" ]; then
    ray start --head --port=6379 --node-ip-address=127.0.0.1 --include-dashboard=false --disable-usage-stats \
      --object-store-memory=4000000000 > "$out/resnet50_data_ray_start.log" 2>&1 || { cat "$out/resnet50_data_ray_start.log"; exit 1; }
    export RAY_ADDRESS=127.0.0.1:6379
    own_ray=1
  fi
  gpus=$(python3 -c "import torch; print(max(1, torch.cuda.device_count()))")
  workers=${RECIPE_WORKERS:-$( [ "$gpus" -gt 1 ] && echo "1 $gpus" || echo 1 )}
  kill_at=${KILL_AT_EPOCH-1}
  for mode in ${RECIPE_MODES:-eager torch_compile}; do
    for n in $workers; do
      name=resnet50_data_${n}w_${mode}
      compile=false; [ "$mode" = torch_compile ] && compile=true
      epochs=(--num_train_epochs 2)
      if [ -n "$kill_at" ]; then  # this run only: a worker dies once, the group restarts from the epoch before
        epochs=(--num_train_epochs $(( kill_at + 2 )) --fail_once_at_epoch "$kill_at"); name=${name}_killed; kill_at=
      fi
      mkdir -p "$out/$name"  # the kill's marker file goes there before the driver writes anything to it
      python3 recipes/ray_resnet50/train.py --dataset_name "$work/images" --download false "${recipe_sizes[@]}" \
        "${epochs[@]}" --num_workers "$n" --data_pipeline device --torch_compile "$compile" \
        --output_dir "$out/$name" --storage_path "$work/ray_results_$name" > "$out/$name.log" 2>&1
      say "recipe $name: rc=$? $(grep '^final' "$out/$name.log")"
    done
  done
  [ "$own_ray" = 1 ] && ray stop --force > /dev/null 2>&1
  python3 - "$out" <<'PY' | tee "$out/resnet50_data_recipe_summary.txt"
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
bench = out / "resnet_data.json"
runs = json.loads(bench.read_text())["runs"] if bench.exists() else {}
for path in sorted(out.glob("resnet50_data_*/metrics.json")):
    m = json.loads(path.read_text())
    ceiling = runs.get("synthetic_compiled" if m["torch_compile"] else "synthetic_eager", {}).get("images_per_s")
    share = f", {m['images_per_s'] / ceiling:.0%} of the synthetic {'compiled' if m['torch_compile'] else 'eager'} ceiling ({ceiling:,.0f})" if ceiling else ""
    print(f"{path.parent.name}: {m['images_per_s']:,.0f} images/s{share}; val accuracy {m['final_val_accuracy']:.3f}; "
          f"epochs {[e['epoch'] for e in m['epochs']]}, worker groups started at {m['worker_group_starts']}, "
          f"killed worker {m['killed_worker']}, {m['wall_s']:.0f} s")
PY
fi
rm -rf "$work"
say "done"
