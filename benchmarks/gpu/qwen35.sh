#!/usr/bin/env bash
# Issue 20 evidence on ONE H200: the FSDP2 recipe on the full-width Qwen3.5-27B stand-in (hidden 5120, 24/4 heads,
# 16/48 linear-attention heads, vocabulary 248,320) with as many layers as nbhelpers.plan says fit one 140 GiB GPU,
# in the 3:1 layout (a multiple of 4 layers), seq 4096, one sequence per step, activation checkpointing, bf16 with
# fp32 master weights, fused AdamW; random weights built on the GPU (random_init), no torch.compile.
#   A. synthetic full-length sequences (one sample per row), the kernels the recipe picks (PyTorch fallback unless
#      flash-linear-attention + causal-conv1d are installed and pass the recipe's check): tokens/s, MFU, peak
#      memory against the planner's estimate for the same shape;
#   B. the same with packed Alpaca rows (data/alpaca, ~20 samples a row): the per-sample fallback's cost;
#   C. only if a fast kernel passes the check here: A with linear_attention_kernels=torch, for the side by side
#      (run before B). flash-linear-attention carries as a pack: pack-site.sh fla.
# If A runs out of memory, it is rerun with 4 layers fewer (the planner's miss is in the log and summary).
# Results: $RESULTS/qwen35/{kernels.txt,plan.json,<run>/metrics.json,<run>.log,summary.json}. About 3 min on one H200.
# Needs MLflow there (the recipe logs to it): PYTHON=.venv/bin/python bash benchmarks/gpu/pack-extra.sh here, carry
# .devsite, and run TOPIC_TIMEOUT=300 bash benchmarks/gpu/run.sh qwen35.
# CPU dry run (tiny stand-in, gloo, seq 256): QWEN35_DRY_RUN=1 RESULTS=/tmp/r bash benchmarks/gpu/qwen35.sh
set -uo pipefail
out=$RESULTS/qwen35; mkdir -p "$out"
work=${TMPDIR:-/tmp}/qwen35-bench; rm -rf "$work"; mkdir -p "$work"
dry=${QWEN35_DRY_RUN:-0}
scale=1; [ "$dry" = 1 ] && scale=6

# The stand-in (config + tokenizer: random_init builds the weights on the GPU), its depth from the planner, and
# which Gated DeltaNet kernels this machine can use.
python3 - "$work" "$out" "$dry" <<'PY'
import json, sys
import torch
import standins  # tests/standins.py (run.sh puts tests/ on PYTHONPATH)
from nbhelpers.plan import plan
work, out, dry = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
size, seq = ("tiny", 256) if dry else ("full", 4096)

def fsdp2(layers):  # the recipe's shape on one GPU: FSDP2, fused AdamW, checkpointing, the PyTorch fallback
    return plan(standins.config("qwen3.5-27b", size, layers=layers), gpus=1, gpu_memory_gib=140.4, seq_len=seq,
                checkpointing=True, fused_adamw=True, linear_attention="torch", suggest=False).estimate("fsdp")

layers = 4 if dry else max(n for n in range(4, 65, 4) if fsdp2(n).fits)
plans = {n: {"allocated_gib": fsdp2(n).allocated, "total_gib": fsdp2(n).total, "at_peak": fsdp2(n).at_peak()}
         for n in (layers, layers - 4) if n > 0}
json.dump({"layers": layers, "seq_len": seq, "size": size, "fsdp2_one_gpu": plans}, open(f"{out}/plan.json", "w"), indent=2)
for n in plans:
    standins.make("qwen3.5-27b", size=size, out=f"{work}/qwen3.5-{n}", weights=False, layers=n)
open(f"{work}/layers", "w").write(str(layers))
sys.path.insert(0, "recipes/fsdp2_qwen3_multinode")
from linear_attention import select_kernels
# at the runs' own shapes, as the recipe checks them: what this compiles and tunes is on disk for the runs
kernels = select_kernels(torch.device("cuda" if torch.cuda.is_available() else "cpu"),
                         config=standins.config("qwen3.5-27b", size, layers=layers), max_length=seq)
open(f"{out}/kernels.txt", "w").write(kernels.describe() + "\n")
open(f"{work}/fast", "w").write("1" if kernels.delta_rule or kernels.conv else "0")
print(f"{layers} layers (planner: {plans[layers]['allocated_gib']:.1f} GiB allocated); {kernels.describe()}")
PY
layers=$(cat "$work/layers")

run() {  # NAME LAYERS LIMIT_S ARGS...: 1 node x 1 GPU, as the README's one-node line with one process
  local name=$1 n=$2 limit=$3; shift 3
  timeout $((limit * scale)) python3 -m torch.distributed.run --nnodes=1 --nproc-per-node=1 --rdzv-backend=c10d \
    --rdzv-endpoint=127.0.0.1:29620 --rdzv-id="$name" recipes/fsdp2_qwen3_multinode/train.py \
    --model_name_or_path "$work/qwen3.5-$n" --output_dir "$out/$name" "$@" > "$out/$name.log" 2>&1
  local rc=$?
  echo "$name ($n layers): rc=$rc"
  return $rc
}
seq=4096; [ "$dry" = 1 ] && seq=256
common=(--random_init true --max_length $seq --per_device_train_batch_size 1 --gradient_accumulation_steps 1
        --gradient_checkpointing true --torch_compile false --save_steps 0 --save_final_model false --logging_steps 4
        --learning_rate 1e-5 --warmup_steps 2)
synthetic=("${common[@]}" --synthetic_data true --max_steps 14 --timing_warmup_steps 4)

fast=$(cat "$work/fast"); tune=0; [ "$fast" = 1 ] && tune=150  # the recipe's own check and first step, should the
# prologue's tuning not cover them (from nothing, fla's compile and tuning at these shapes took more than 4 minutes)
if ! run synthetic_${layers}_layers "$layers" $((100 + tune)) "${synthetic[@]}"; then
  if grep -q "out of memory" "$out/synthetic_${layers}_layers.log"; then
    layers=$((layers - 4))
    run synthetic_${layers}_layers "$layers" $((90 + tune)) "${synthetic[@]}"
  fi
fi
if [ "$fast" = 1 ]; then  # the side by side before the packed run, so that a call cut short keeps it
  run synthetic_${layers}_layers_torch_kernels "$layers" 100 "${synthetic[@]}" --linear_attention_kernels torch
fi
run packed_${layers}_layers "$layers" $((90 + tune)) "${common[@]}" --synthetic_data false --dataset_name data/alpaca \
  --max_steps 8 --timing_warmup_steps 3

python3 - "$out" <<'PY'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
plans = json.loads((out / "plan.json").read_text())["fsdp2_one_gpu"]
summary = {"kernels": (out / "kernels.txt").read_text().strip()}
for path in sorted(out.glob("*/metrics.json")):
    m = json.loads(path.read_text())
    layers = str(m["config"]["model_name_or_path"]).rsplit("-", 1)[-1]
    peak = max(m["peak_memory_bytes"]) / 2**30 if m["peak_memory_bytes"][0] is not None else None
    planned = plans.get(layers, {}).get("allocated_gib")
    row = {"layers": int(layers), "tokens_per_s": m["tokens_per_s"], "mfu": m["mfu"], "flops_per_token": m["flops_per_token"],
           "peak_allocated_gib": peak, "planner_allocated_gib": planned,
           "planner_vs_measured": planned / peak - 1 if peak and planned else None,
           "linear_attention_kernels": m.get("linear_attention_kernels"), "losses": m["losses"],
           "first_step_seconds": m["first_step_seconds"], "devices": m["environment"]["devices"]}
    summary[path.parent.name] = row
    tps = f"{row['tokens_per_s']:,.0f} tok/s" if row["tokens_per_s"] else "-"
    mfu = f"MFU {row['mfu']:.1%}" if row["mfu"] else ""
    mem = (f"peak {peak:.1f} GiB vs planner {planned:.1f} ({row['planner_vs_measured']:+.0%})"
           if row["planner_vs_measured"] is not None else "")
    print(f"{path.parent.name:34s} {tps:>14s} {mfu:10s} {mem}  loss {m['initial_loss']:.3f} -> {m['final_loss']:.3f}")
(out / "summary.json").write_text(json.dumps(summary, indent=2))
print(summary["kernels"])
PY
