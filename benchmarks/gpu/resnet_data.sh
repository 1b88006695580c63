#!/usr/bin/env bash
# Issues 21 §1 and 59, evidence on one GPU: ResNet-50 fed by the Ray recipe's data paths, side by side in one run.
#   stage bench (default; nothing carried, no Ray): benchmarks/resnet_data.py writes TRAIN_IMAGES (32,000) + 1,000
#     ImageNet-sized JPEGs (~110 kB, ~0.2 MP) to local disk with every core, then trains the recipe's step at batch 256
#     fed by (a) synthetic tensors on the GPU (the ceiling), (b) the old DataLoader path (DATALOADER_PATH=0: not),
#     (c) the nvJPEG device path PREFETCH_BATCHES (3) ahead of the step, and in turn with it (--prefetch_batches 0),
#     (d) synthetic tensors with the device path's work beside the step; (a), (c), (d) eager and compiled; profiles
#     (c)'s stages alone and the GPU's streams while (a) and (c) train. About 2-3 minutes on one H100.
#   stage recipe (STAGES=recipe; ray carried as for ray.sh): recipes/ray_resnet50/train.py under Ray Train,
#     device pipeline, 2 epochs each, for each of RECIPE_MODES (default "eager torch_compile") on each of
#     RECIPE_WORKERS workers (default 1, and every GPU when there are more), then each of NO_OVERLAP_MODES (default
#     none) once more on 1 worker with --prefetch_batches 0 (the overlap's baseline). About 4 minutes on one H200;
#     on 2 GPUs use RECIPE_MODES=torch_compile (1 and 2 workers: the scaling figure). The first run's last worker
#     kills itself halfway through epoch KILL_AT_EPOCH (default 1; empty: no kill), which trains one epoch more than
#     the others, so Ray Train's restart and the resume from the epoch before are part of the evidence.
# After each stage and recipe run, resnet50_data_table.txt: each run's images/s as a share of the same call's ceiling.
# Issue 59's call (one H100, ~7 minutes): STAGES="bench recipe" TRAIN_IMAGES=20000 DATALOADER_PATH=0
#   NO_OVERLAP_MODES=torch_compile TOPIC_TIMEOUT=570 bash benchmarks/gpu/run.sh resnet_data
# Results: $RESULTS/ray/resnet_data.json, resnet_data_summary.txt (one line), trace_*.json.gz, logs; recipe runs in
# $RESULTS/ray/resnet50_data_*/metrics.json. A CPU dry run of the logic (seconds of training, no compile):
#   RESULTS=/tmp/r RESNET_DATA_DRY_RUN=1 bash benchmarks/gpu/resnet_data.sh
set -uo pipefail
out=$RESULTS/ray
mkdir -p "$out"
work=$(mktemp -d /tmp/resnetdata.XXXXXX)
STAGES=${STAGES:-bench}
begin=$(date +%s)
say() { echo "[$(( $(date +%s) - begin )) s] $*"; }
bench_flags=(--prefetch_batches "${PREFETCH_BATCHES:-3}")
[ "${DATALOADER_PATH:-1}" = 0 ] && bench_flags+=(--no-dataloader_path)
if [ "${RESNET_DATA_DRY_RUN:-0}" = 1 ]; then
  sizes=(--train_images 96 --val_images 24 --max_side 64 --image_size 32 --per_device_train_batch_size 8
         --timed_steps 3 --timing_warmup_steps 2 --dataloader_num_workers 2 --no-torch_compile)
  recipe_sizes=(--image_size 32 --per_device_train_batch_size 8 --weights none)
else
  sizes=(--train_images "${TRAIN_IMAGES:-32000}" --val_images 1000 --per_device_train_batch_size "${BATCH:-256}")
  recipe_sizes=(--image_size 224 --per_device_train_batch_size "${BATCH:-256}" --weights none)
fi

table() {  # every figure so far, as shares of the same call's ceiling, into resnet50_data_table.txt
  python3 - "$out" <<'PY' > "$out/resnet50_data_table.txt"
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
bench = json.loads((out / "resnet_data.json").read_text()) if (out / "resnet_data.json").exists() else {}
runs = bench.get("runs", {})
recipes = {}
for path in sorted(out.glob("resnet50_data_*/metrics.json")):
    m = json.loads(path.read_text())
    recipes[path.parent.name] = m

def cell(value, mode):
    ceiling = runs.get(f"synthetic_{mode}", {}).get("images_per_s")
    if value is None:
        return "-"
    return f"{value:,.0f} ({value / ceiling:.0%})" if ceiling else f"{value:,.0f}"

def bench_row(label, name):
    return [label] + [cell(runs.get(name.format(mode), {}).get("images_per_s"), mode) for mode in ("eager", "compiled")]

def recipe_row(label, overlap):
    cells = [label]
    for mode in ("eager", "compiled"):
        found = [m for n, m in recipes.items() if m["torch_compile"] == (mode == "compiled") and m["world_size"] == 1
                 and (m.get("prefetch_batches", 2) > 0) == overlap]
        cells.append(cell(found[0]["images_per_s"], mode) if found else "-")
    return cells

device = bench.get("environment", {}).get("device", "?")
settings = bench.get("settings", {})
ahead, batch = settings.get("prefetch_batches", "?"), settings.get("per_device_train_batch_size", "?")
rows = [[f"images/s, one GPU ({device}), batch {batch}", "eager", "compiled"],
        bench_row("ceiling: synthetic tensors on the GPU", "synthetic_{}"),
        bench_row("ceiling, device path's work beside it", "synthetic_{}_data_beside"),
        bench_row(f"benchmark, device path {ahead} ahead", "device_{}"),
        bench_row("benchmark, device path in turn (0)", "device_{}_no_overlap"),
        recipe_row("recipe under Ray Train, overlap", True),
        recipe_row("recipe, --prefetch_batches 0", False)]
widths = [max(len(r[i]) for r in rows) for i in range(3)]
for r in rows:
    print(" | ".join(c.ljust(w) for c, w in zip(r, widths)))
for name, m in recipes.items():
    print(f"{name}: prefetch_batches {m.get('prefetch_batches', '-')}, val accuracy {m['final_val_accuracy']:.3f} after "
          f"epochs {[e['epoch'] for e in m['epochs']]}, worker groups started at {m['worker_group_starts']}, killed "
          f"{m['killed_worker']}, {m['wall_s']:.0f} s")
for mode in ("eager", "compiled"):
    d, s = (bench.get("stream_profiles", {}).get(f"{k}_{mode}", {}) for k in ("device", "synthetic"))
    if "step_kernels_ms_per_step" in d and "step_kernels_ms_per_step" in s:
        print(f"streams, {mode} (ms/step, device path vs synthetic): step kernels {d['step_kernels_ms_per_step']:.1f} vs "
              f"{s['step_kernels_ms_per_step']:.1f}, step's stream idle {d['step_stream_idle_ms_per_step']:.1f} vs "
              f"{s['step_stream_idle_ms_per_step']:.1f}, data path {d['data_streams_ms_per_step']:.1f} "
              f"({d['data_beside_step_share']:.0%} beside the step's kernels)")
p = bench.get("profile", {})
if "decode" in p:
    print(f"alone: reads {p['read']['images_per_s']:,.0f}, nvJPEG {p['decode']['images_per_s']:,.0f} "
          f"({p['decode']['ms_per_batch']:.1f} ms/batch), crops {p['augment']['images_per_s']:,.0f} "
          f"({p['augment']['ms_per_batch']:.1f} ms/batch), device path {p.get('device_pipeline_alone', {}).get('images_per_s', 0):,.0f} images/s")
PY
}

df -hT /tmp > "$out/resnet_data_disk.txt" 2>&1  # where the JPEGs live (a tmpfs would be RAM, like the page cache)
if [[ " $STAGES " == *" bench "* ]]; then
  python3 benchmarks/resnet_data.py --output_dir "$out" --data_dir "$work/images" "${sizes[@]}" "${bench_flags[@]}" \
    > "$out/resnet_data.log" 2>&1
  say "bench: rc=$? $(cat "$out/resnet_data_summary.txt" 2>/dev/null || tail -n 3 "$out/resnet_data.log")"
  table
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
  runs=()  # mode:workers:prefetch_batches
  for mode in ${RECIPE_MODES:-eager torch_compile}; do
    for n in $workers; do runs+=("$mode:$n:${PREFETCH_BATCHES:-3}"); done
  done
  for mode in ${NO_OVERLAP_MODES:-}; do runs+=("$mode:1:0"); done
  for spec in "${runs[@]}"; do
    IFS=: read -r mode n prefetch <<< "$spec"
    name=resnet50_data_${n}w_${mode}
    [ "$prefetch" = 0 ] && name=${name}_no_overlap
    compile=false; [ "$mode" = torch_compile ] && compile=true
    epochs=(--num_train_epochs 2)
    if [ -n "$kill_at" ]; then  # this run only: a worker dies once mid-epoch, the group restarts from the epoch before
      epochs=(--num_train_epochs $(( kill_at + 2 )) --fail_once_at_epoch "$kill_at"); name=${name}_killed; kill_at=
    fi
    mkdir -p "$out/$name"  # the kill's marker file goes there before the driver writes anything to it
    python3 recipes/ray_resnet50/train.py --dataset_name "$work/images" --download false "${recipe_sizes[@]}" \
      "${epochs[@]}" --num_workers "$n" --data_pipeline device --prefetch_batches "$prefetch" --torch_compile "$compile" \
      --output_dir "$out/$name" --storage_path "$work/ray_results_$name" > "$out/$name.log" 2>&1
    say "recipe $name: rc=$? $(grep '^final' "$out/$name.log")"
    table
  done
  [ "$own_ray" = 1 ] && ray stop --force > /dev/null 2>&1
fi
cat "$out/resnet50_data_table.txt" 2>/dev/null
rm -rf "$work"
say "done"
