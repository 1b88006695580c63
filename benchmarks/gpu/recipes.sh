#!/usr/bin/env bash
# Issue 9 evidence on 2 H200s (see recipes.md), in order of importance, each part bounded. On a machine with one
# GPU every launch runs one process and the parts that need two GPUs (2 nodes x 1 GPU; the Qwen3-8B architecture,
# whose fp32 weights and AdamW state alone take 131 GB) are skipped with a line saying so.
#   1. MFU: the FSDP2 recipe on the full-size Llama-3.2-1B architecture, seq 2048, batch 4/GPU, 1 node x 2 GPUs
#      (torch.compile per layer, no activation checkpointing, bf16, fused AdamW), 20 timed steps after warm-up;
#   2. the same recipe on the full-size Qwen3-8B architecture (activation checkpointing on), a few steps;
#   3. every recipe briefly as 2 nodes x 1 GPU (two torchrun agents, one GPU each) and as 1 node x 2 GPUs,
#      with tiny stand-ins, all six launches at once (they are launch/NCCL checks, not measurements);
#   4. the FSDP2 recipe resumed from the sealed checkpoint of one of them (nbhelpers.training.checkpoints on NCCL).
# Results: $RESULTS/recipes/<run>/metrics.json, <run>.log, <run>.mlflow.db, summary.json. Budget: about 230 s.
# On a CPU machine, RECIPES_DRY_RUN=1 runs the same launches with tiny models and gloo (logic check only).
set -uo pipefail
out=$RESULTS/recipes; mkdir -p "$out"
work=${TMPDIR:-/tmp}/recipes-bench; rm -rf "$work"; mkdir -p "$work"
dry=${RECIPES_DRY_RUN:-0}
scale=1; [ "$dry" = 1 ] && scale=8  # a small CPU machine needs far longer limits
# processes per launch: 2 GPUs where there are (the CPU dry run: 2 processes); RECIPES_GPUS=1 forces one
gpus=${RECIPES_GPUS:-$(python3 -c "import torch; print(min(2, torch.cuda.device_count()) or 2)")}

python3 - "$work" "$dry" <<'PY'
import sys
import standins  # tests/standins.py (run.sh puts tests/ on PYTHONPATH)
work, dry = sys.argv[1], sys.argv[2] == "1"
for arch in ("llama-3.2-1b", "qwen3-8b"):  # config + tokenizer only: random_init builds the weights on the GPUs
    standins.make(arch, size="tiny" if dry else "full", out=f"{work}/{arch}-bench", weights=dry)
for arch in ("llama-3.1-8b", "qwen3-0.6b", "qwen3-8b"):
    standins.make(arch, size="tiny", out=f"{work}/{arch}-tiny")
PY

# torchrun as the recipes' READMEs write it: one agent per node, c10d rendezvous.
one_node() {  # NAME PORT LIMIT_S SCRIPT ARGS...: 1 node x $gpus GPUs
  local name=$1 port=$2 limit=$3 script=$4; shift 4
  timeout $((limit * scale)) python3 -m torch.distributed.run --nnodes=1 --nproc-per-node=$gpus --rdzv-backend=c10d \
    --rdzv-endpoint=127.0.0.1:$port --rdzv-id="$name" "$script" "$@" --output_dir "$out/$name" \
    --mlflow_tracking_uri "sqlite:///$out/$name.mlflow.db" > "$out/$name.log" 2>&1
  echo "$name: rc=$?"
}
two_nodes() {  # NAME PORT LIMIT_S SCRIPT ARGS...: 2 nodes x 1 GPU on this host, node n sees GPU n only
  local name=$1 port=$2 limit=$3 script=$4 n pids=() rcs=""; shift 4
  [ "$gpus" -lt 2 ] && { echo "$name: skipped (2 nodes x 1 GPU needs 2 GPUs)"; return; }
  for n in 0 1; do
    CUDA_VISIBLE_DEVICES=$n timeout $((limit * scale)) python3 -m torch.distributed.run --nnodes=2 --nproc-per-node=1 \
      --node-rank=$n --rdzv-backend=c10d --rdzv-endpoint=127.0.0.1:$port --rdzv-id="$name" --rdzv-conf=join_timeout=$((60 * scale)) \
      "$script" "$@" --output_dir "$out/$name" --mlflow_tracking_uri "sqlite:///$out/$name.mlflow.db" \
      > "$out/$name.node$n.log" 2>&1 &
    pids+=($!)
    sleep 1
  done
  for n in 0 1; do wait "${pids[$n]}"; rcs="$rcs $?"; done
  echo "$name: rc (node 0, node 1) =$rcs"
}

fsdp2=recipes/fsdp2_qwen3_multinode/train.py
fsdp1=recipes/fsdp_llama_3_1_8b_multinode/train.py
ds=recipes/deepspeed_qwen3_8b_invoices/train.py
bench=(--random_init true --synthetic_data true --max_length 2048 --per_device_train_batch_size 4
       --gradient_accumulation_steps 1 --save_steps 0 --save_final_model false --logging_steps 10)
compile=true; [ "$dry" = 1 ] && compile=false && bench+=(--max_length 256)

# 1. MFU, Llama-3.2-1B architecture: everything for speed (no recompute, layers stay gathered between
#    forward and backward: the 1B model fits many times over).
one_node mfu_llama_3_2_1b 29601 120 $fsdp2 "${bench[@]}" --model_name_or_path "$work/llama-3.2-1b-bench" --max_steps 30 \
  --timing_warmup_steps 10 --gradient_checkpointing false --reshard_after_forward false --torch_compile $compile
# 2. Qwen3-8B architecture: 8.2 B parameters, activation checkpointing on (MFU counts no recompute).
if [ "$gpus" -ge 2 ]; then
  one_node mfu_qwen3_8b 29602 110 $fsdp2 "${bench[@]}" --model_name_or_path "$work/qwen3-8b-bench" --max_steps 9 \
    --timing_warmup_steps 3 --gradient_checkpointing true --reshard_after_forward true --torch_compile $compile
else
  echo "mfu_qwen3_8b: skipped (8.2 B parameters need 2 GPUs)"
fi

# 3. Each recipe as 2 nodes x 1 GPU and as 1 node x 2 GPUs (x 1 on one GPU), all at once, tiny stand-ins.
a1=(--model_name_or_path "$work/llama-3.1-8b-tiny" --dataset_name data/alpaca --max_steps 12 --learning_rate 3e-3
    --warmup_steps 2 --logging_steps 4)
a2=(--model_name_or_path "$work/qwen3-0.6b-tiny" --dataset_name data/alpaca --max_length 512 --per_device_train_batch_size 4
    --max_steps 12 --learning_rate 3e-3 --warmup_steps 2 --save_steps 6 --torch_compile false --logging_steps 4)
# TRL's parser: config.yaml's paths are relative to the recipe's folder, so the DeepSpeed JSON is given from here
a3=(--config recipes/deepspeed_qwen3_8b_invoices/config.yaml --deepspeed recipes/deepspeed_qwen3_8b_invoices/ds_zero3.json
    --model_name_or_path "$work/qwen3-8b-tiny" --dataset_name data/invoices --num_train_epochs 2 --max_train_samples 192
    --max_predict_samples 8 --learning_rate 3e-3 --per_device_train_batch_size 8 --per_device_eval_batch_size 8
    --gradient_accumulation_steps 1 --logging_steps 4 --max_new_tokens 64 --ddp_timeout 120)
[ "$dry" = 1 ] && a3+=(--bf16 false --dtype float32)  # CPU
two_nodes fsdp_2x1 29611 100 $fsdp1 "${a1[@]}" &
one_node fsdp_1x$gpus 29612 100 $fsdp1 "${a1[@]}" &
two_nodes fsdp2_2x1 29613 100 $fsdp2 "${a2[@]}" &
one_node fsdp2_1x$gpus 29614 100 $fsdp2 "${a2[@]}" &
two_nodes deepspeed_2x1 29615 110 $ds "${a3[@]}" &
one_node deepspeed_1x$gpus 29616 110 $ds "${a3[@]}" &
wait

# 4. Resume on NCCL: a copy of fsdp2_1xG's sealed step-6 checkpoint, the same command again (the ranks verify the
#    shards together and agree on where to resume); steps 7-12 should repeat fsdp2_1xG's losses.
mkdir -p "$out/fsdp2_resume_1x$gpus" && cp -r "$out/fsdp2_1x$gpus/checkpoints" "$out/fsdp2_resume_1x$gpus/"
one_node fsdp2_resume_1x$gpus 29617 60 $fsdp2 "${a2[@]}"

python3 - "$out" <<'PY'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
keys = ("world_size", "nodes", "tokens_per_s", "tokens_per_s_per_gpu", "mfu", "flops_per_token", "first_step_seconds",
        "timed_steps", "parameters", "local_shard_numel", "peak_memory_bytes", "initial_loss", "final_loss",
        "initial_eval_loss", "best_eval_loss", "resumed_from_step")
summary = {}
for path in sorted(out.glob("*/metrics.json")):
    metrics = json.loads(path.read_text())
    row = {k: metrics[k] for k in keys if k in metrics}
    row["devices"] = metrics["environment"]["devices"]
    for when in ("before", "after"):
        if when in metrics:
            row[when] = {k: metrics[when][k] for k in ("json_valid", "field_exact_match")}
    summary[path.parent.name] = row
    gib = [round(b / 2**30, 1) for b in metrics.get("peak_memory_bytes", [])]
    mfu = f"MFU {metrics['mfu']:.1%}" if metrics.get("mfu") else ""
    tps = f"{metrics['tokens_per_s']:,.0f} tok/s" if metrics.get("tokens_per_s") else ""
    print(f"{path.parent.name:18s} world {metrics['world_size']} nodes {metrics['nodes']}  {tps:>16s}  {mfu:10s} "
          f"peak GiB {gib}  loss {metrics['initial_loss']:.3f} -> {metrics['final_loss']:.3f}")
(out / "summary.json").write_text(json.dumps(summary, indent=2))
PY
