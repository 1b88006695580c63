#!/usr/bin/env bash
# Issue 11 evidence: nbhelpers.planner.plan's per-GPU estimate next to the measured peak memory, 2 GPUs, side by
# side in one launch per model (benchmarks/measure_memory.py; see planner.md). ~80 s on 2x H200.
# CPU dry run of the same logic: PLANNER_DRY_RUN=1 RESULTS=/tmp/r bash benchmarks/gpu/planner.sh
set -uo pipefail
out=$RESULTS/planner; mkdir -p "$out"
if [ -n "${PLANNER_DRY_RUN:-}" ]; then size=tiny seq=64 mb=2; else size=full seq=2048 mb=4; fi
launch=(python3 -m torch.distributed.run --standalone --nproc-per-node 2 benchmarks/measure_memory.py --size "$size")

# Llama-3.2-1B (published dimensions, random weights), full fine-tune, bf16-mixed, AdamW, 4 x 2048 tokens
# per GPU: DDP, FSDP2, DeepSpeed ZeRO-3 (the required three first), then FSDP2 with activation checkpointing.
timeout "${LLAMA_TIMEOUT:-85}" "${launch[@]}" --arch llama-3.2-1b --seq-len "$seq" --micro-batch "$mb" --steps 5 --warmup 2 \
  --technique ddp fsdp2 zero3 fsdp2+ckpt --out "$out/llama-3.2-1b.json" > "$out/llama-3.2-1b.log" 2>&1
echo "llama-3.2-1b: rc=$?"
# GPT-OSS-20B's MoE layers (4 of its 24: 32 experts, top-4, grouped_mm; eager attention with sinks), FSDP2,
# 4 x 2048 tokens per GPU (so activations, not the optimizer step, set the peak): checks the MoE parameter
# count and the expert and eager-attention activation terms.
timeout "${MOE_TIMEOUT:-40}" "${launch[@]}" --arch gpt-oss-20b --layers 4 --seq-len "$seq" --micro-batch "$mb" --steps 4 --warmup 2 \
  --technique fsdp2 --out "$out/gpt-oss-20b-4-layers.json" > "$out/gpt-oss-20b-4-layers.log" 2>&1
echo "gpt-oss-20b (4 layers): rc=$?"

python3 - "$out" <<'PY'
import json, pathlib, sys
for path in sorted(pathlib.Path(sys.argv[1]).glob("*.json")):
    for r in json.loads(path.read_text())["results"]:
        name = f"{r['arch']} {r['technique']}{' +ckpt' if r.get('checkpointing') else ''}"
        if "error" in r:
            print(f"{name:34s} ERROR {r['error'][:300]}")
            continue
        print(f"{name:34s} measured {r['measured_max_allocated_gib']:6.1f} GiB allocated "
              f"(reserved {r['measured_max_reserved_gib']:5.1f}, device used {r['measured_device_used_gib']:5.1f})  "
              f"planner {r['planner']['allocated_gib']:6.1f} (+allowance {r['planner']['total_gib']:5.1f})  "
              f"{r['estimate_vs_measured']:+.1%}  step {r['ranks'][0]['step_s']:.2f} s")
PY
