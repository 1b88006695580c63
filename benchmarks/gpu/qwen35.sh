#!/usr/bin/env bash
# The FSDP2 recipe on ONE H200 with the full-width Qwen3.8-27B stand-in (hidden 5120, 24/4 heads, 16/48
# linear-attention heads, vocabulary 248,320) cut to as many layers as the planner fits this GPU at 4,096
# tokens (12 on an H200 of 140 GiB, in the 3:1 layout), one row per step, activation checkpointing, bf16 with fp32 master weights, fused AdamW,
# random weights built on the GPU (random_init). Chat rows: data/capybara's conversations chained into chats of about
# 1,240 tokens (what Databricks' Qwen3.8-27B recipe packs: 983 steps x 32 GPUs x 8,192 tokens over UltraChat's
# 207,865 train_sft conversations), through the stand-in's chat template, the loss on the assistant's tokens.
# Stages, in QWEN35_STAGES, run in the order given (default "tune defaults"); the work folder is kept between calls, so that a second call
# made at once reuses the stand-ins, the data and Triton's tuned kernels:
#   tune      stand-ins, chat data, plan.json, the recipe's kernel check at 4,096 and 8,192 tokens (fla compiles and
#             autotunes on a fresh machine: more than 4 minutes)
#   defaults  the recipe's defaults (flex_attention, torch.compile, fla): packed chat rows and synthetic rows, 4,096
#   reference the same packed rows through the PyTorch reference (sdpa, eager, transformers' PyTorch Gated DeltaNet
#             run sample by sample): the losses to match
#   sdpa      the same packed rows with sdpa's dense block-diagonal mask, compiled (what flex_attention replaces)
#   long      8,192-token rows, synthetic and packed chat
#   profile   packed chat rows at 4,096 under torch.profiler (benchmarks/gpu/profile_steps.py)
# Results: $RESULTS/qwen35/{plan.json,kernels.txt,<run>/metrics.json,<run>.log,summary.json,profile_*.txt}.
# Needs MLflow and TRL there: PYTHON=.venv/bin/python bash benchmarks/gpu/pack-site.sh trl fla;
# PYTHON=.venv/bin/python bash benchmarks/gpu/pack-extra.sh; carry .devsite; QWEN35_STAGES="tune defaults"
# bash benchmarks/gpu/run.sh qwen35:580
# CPU dry run (tiny stand-in, gloo, 256 tokens): QWEN35_DRY_RUN=1 RESULTS=/tmp/r bash benchmarks/gpu/qwen35.sh
set -uo pipefail
out=$RESULTS/qwen35; mkdir -p "$out"
work=${TMPDIR:-/tmp}/qwen35-bench; mkdir -p "$work"
dry=${QWEN35_DRY_RUN:-0}
stages=" ${QWEN35_STAGES:-tune defaults} "
has() { [[ $stages == *" $1 "* ]]; }
short=4096; long=8192; [ "$dry" = 1 ] && short=256 && long=512

if has tune || [ ! -e "$work/layers" ]; then
has long || long=0  # the kernels' check at 8,192 only when those rows run
python3 - "$work" "$out" "$dry" "$short" "$long" <<'PY'
import json, sys
import torch
import standins  # tests/standins.py (run.sh puts tests/ on PYTHONPATH)
from nbhelpers.planner.plan import plan
from transformers import AutoTokenizer
work, out, dry, short, long = sys.argv[1], sys.argv[2], sys.argv[3] == "1", int(sys.argv[4]), int(sys.argv[5])
size = "tiny" if dry else "full"

gib = torch.cuda.get_device_properties(0).total_memory / 2**30 if torch.cuda.is_available() else 140.4

def fsdp2(layers, seq):  # the recipe's shape on this GPU: FSDP2, fused AdamW, checkpointing, fla
    return plan(standins.config("qwen3.8-27b", size, layers=layers), gpus=1, gpu_memory_gib=gib, seq_len=seq,
                checkpointing=True, fused_adamw=True, linear_attention="fla", suggest=False).estimate("fsdp")

layers = 4 if dry else max(n for n in range(4, 65, 4) if fsdp2(n, short).fits)
plans = {seq: {"allocated_gib": fsdp2(layers, seq).allocated, "total_gib": fsdp2(layers, seq).total,
               "at_peak": fsdp2(layers, seq).at_peak()} for seq in (short, long) if seq}
json.dump({"layers": layers, "size": size, "gpu_memory_gib": gib, "fsdp2_one_gpu": plans}, open(f"{out}/plan.json", "w"), indent=2)
path = standins.make("qwen3.8-27b", size=size, out=f"{work}/qwen3.8-{layers}", weights=False, layers=layers)
open(f"{work}/layers", "w").write(str(layers))

# Chats of about 1,240 tokens: capybara's conversations, one after another in the same chat, until that length.
tokenizer = AutoTokenizer.from_pretrained(path)
tokens = lambda messages: tokenizer.apply_chat_template(messages, tokenize=True, return_dict=True)["input_ids"]
rows = [json.loads(line) for line in open("data/capybara/train.jsonl")]
chats, messages = [], []
for row in rows:
    messages += row["messages"]
    if len(tokens(messages)) >= 1240:
        chats.append({"messages": messages})
        messages = []
with open(f"{work}/chats.jsonl", "w") as f:
    f.writelines(json.dumps(chat) + "\n" for chat in chats)
lengths = [len(tokens(c["messages"])) for c in chats]
json.dump({"chats": len(chats), "mean_tokens": sum(lengths) / len(lengths), "min": min(lengths), "max": max(lengths)},
          open(f"{out}/chats.json", "w"))
print(f"{layers} layers; {len(chats)} chats of {sum(lengths) / len(lengths):.0f} tokens on average")

sys.path.insert(0, "recipes/fsdp2_qwen3_multinode")
from linear_attention import select_kernels
config = standins.config("qwen3.8-27b", size, layers=layers)
for seq in [n for n in (short, long) if n]:  # at the runs' own shapes, as the recipe checks them: compiled and tuned once, on disk
    kernels = select_kernels(torch.device("cuda" if torch.cuda.is_available() else "cpu"), config=config, max_length=seq)
    open(f"{out}/kernels.txt", "a").write(f"{seq}: {kernels.describe()}\n")
    print(seq, kernels.describe(), flush=True)
PY
fi
layers=$(cat "$work/layers")
model="$work/qwen3.8-$layers"

run() {  # NAME LIMIT_S ARGS...: 1 node x 1 GPU, as the README's one-node line with one process
  local name=$1 limit=$2; shift 2
  local launcher=(recipes/fsdp2_qwen3_multinode/train.py)
  [ "${PROFILE:-}" ] && launcher=(benchmarks/gpu/profile_steps.py "$out/profile_$name" "$PROFILE" "${launcher[@]}")
  timeout "$limit" python3 -m torch.distributed.run --nnodes=1 --nproc-per-node=1 --rdzv-backend=c10d \
    --rdzv-endpoint=127.0.0.1:29620 --rdzv-id="$name" "${launcher[@]}" \
    --model_name_or_path "$model" --output_dir "$out/$name" "$@" > "$out/$name.log" 2>&1
  echo "$name: rc=$?"
  grep -E "^throughput|Gated DeltaNet kernels" "$out/$name.log" | tail -2
}
common=(--random_init true --per_device_train_batch_size 1 --gradient_accumulation_steps 1 --gradient_checkpointing true
        --save_steps 0 --save_final_model false --logging_steps 1 --learning_rate 1e-5 --warmup_steps 2)
chats=(--synthetic_data false --dataset_name "$work/chats.jsonl" --dataset_train_split train)
synthetic=(--synthetic_data true)
steps=(--max_steps 12 --timing_warmup_steps 4)

for stage in $stages; do  # in the order given
  case $stage in
    defaults)
      run packed_$short 240 "${common[@]}" "${chats[@]}" "${steps[@]}" --max_length $short
      run synthetic_$short 240 "${common[@]}" "${synthetic[@]}" "${steps[@]}" --max_length $short ;;
    reference)  # the same packed rows through the PyTorch reference: the losses to match
      run packed_${short}_pytorch_reference 200 "${common[@]}" "${chats[@]}" "${steps[@]}" \
        --max_length $short --attn_implementation sdpa --torch_compile false --linear_attention_kernels torch ;;
    sdpa)  # what flex_attention replaces: the dense block-diagonal mask, compiled as well
      run packed_${short}_sdpa_compiled 200 "${common[@]}" "${chats[@]}" "${steps[@]}" --max_length $short \
        --attn_implementation sdpa ;;
    long)
      run synthetic_$long 240 "${common[@]}" "${synthetic[@]}" "${steps[@]}" --max_length $long
      run packed_$long 240 "${common[@]}" "${chats[@]}" "${steps[@]}" --max_length $long ;;
    profile)
      PROFILE=5 run profiled_packed_$short 200 "${common[@]}" "${chats[@]}" --max_steps 9 --timing_warmup_steps 4 \
        --max_length $short ;;
  esac
done

python3 - "$out" <<'PY'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
plans = json.loads((out / "plan.json").read_text())["fsdp2_one_gpu"] if (out / "plan.json").exists() else {}
summary = {"kernels": (out / "kernels.txt").read_text().strip() if (out / "kernels.txt").exists() else None}
for path in sorted(out.glob("*/metrics.json")):
    m = json.loads(path.read_text())
    c = m["config"]
    peak = max(m["peak_memory_bytes"]) / 2**30 if m["peak_memory_bytes"][0] is not None else None
    planned = plans.get(str(c["max_length"]), {}).get("allocated_gib")
    summary[path.parent.name] = row = {
        "max_length": c["max_length"], "attn_implementation": c["attn_implementation"],
        "torch_compile": c["torch_compile"], "linear_attention_kernels": m.get("linear_attention_kernels"),
        "tokens_per_s": m["tokens_per_s"], "mfu": m["mfu"], "peak_allocated_gib": peak,
        "planner_allocated_gib": planned, "planner_vs_measured": planned / peak - 1 if peak and planned else None,
        "losses": m["losses"], "first_step_seconds": m["first_step_seconds"], "devices": m["environment"]["devices"]}
    mfu = f"MFU {row['mfu']:.1%}" if row["mfu"] else ""
    mem = f"peak {peak:.1f} GiB (planner {planned:.1f})" if peak and planned else ""
    print(f"{path.parent.name:36s} {row['tokens_per_s'] or 0:>9,.0f} tok/s {mfu:10s} {mem} first step "
          f"{row['first_step_seconds']:.0f} s")
for name, row in list(summary.items()):
    ref = summary.get(f"{name}_pytorch_reference") if isinstance(row, dict) else None
    if ref:
        n = min(len(ref["losses"]), len(row["losses"]))
        row["max_loss_difference_to_pytorch_reference"] = max(abs(a - b) for a, b in zip(row["losses"][:n], ref["losses"][:n]))
        print(f"{name}: losses within {row['max_loss_difference_to_pytorch_reference']:.4f} of the PyTorch reference's "
              f"over {n} steps")
(out / "summary.json").write_text(json.dumps(summary, indent=2))
PY
