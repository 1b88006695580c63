#!/usr/bin/env bash
# Issue 38 on ONE H200: GPT-OSS LoRA speed as the TRL notebooks configure it, side by side in one call.
# Stages (GPT_OSS_STAGES, in this order; the first three are runs of benchmarks/gpt_oss_speed.py, which trains with
# the notebook's own settings):
#   speed   GPT-OSS-20B, full size, 24 layers, packed rows of 2,048 tokens, 4 a micro-step: each decoder layer
#           compiled (its last step profiled, after the timed ones), then (with stage `eager`) eager: same seed and data, the losses compare.
#   padded  the same without packing (the notebook before it): real tokens/s of padded batches, eager and compiled.
#   fsdp    GPT-OSS-120B at full width with GPT_OSS_120B_LAYERS layers (default 8), FSDP2 through the Trainer under
#           torchrun on one GPU, per-GPU batch 2 x 2,048, the experts' LoRA on their tokens as the notebook computes
#           it: each decoder layer compiled, then eager; the last step of each profiled.
#   fsdp_peft   the same with the experts' LoRA left to PEFT (W + BA for every expert: the notebook before
#           2026-12-06's last change), eager (compiled layers cannot hold PEFT's parametrization), profiled.
#   fsdp_batch8   the same rows a step (16 of 2,048 tokens) in micro-batches of 8, gradient accumulation 2: compiled, eager.
#   fsdp_attention   the same with LoRA on the attention only (--attention_only_lora), compiled, then eager.
#   nb20b   the DDP notebook through papermill on a stand-in written here (all 24 layers, MXFP4 experts), num_gpus 1,
#           8 steps, no merge, the runs named in GPT_OSS_NB20B_RUNS (default "compiled eager": torch_compile True
#           then False, the activations fitted as the memory planner chooses; "compiled_checkpointing": compiled with
#           `gradient_checkpointing: true` in its config file, every layer checkpointed at the notebook's 4 x 4
#           micro-steps, the baseline; "compiled_no_checkpointing": false, the planner not asked, for a GPU where it
#           plans too little room). The stand-in stays for a later call on the same machine.
#   every2  (after nb20b, whose compiled graphs it reuses) the speed stage's run (compiled, packed, 4 x 2,048 a
#           micro-step) with gradient checkpointing of every 2nd decoder layer only (`every_n_layers`: the planner's third
#           way to fit), GPT_OSS_EVERY2_STEPS steps (default 5): its peak beside the planner's estimate.
#   nb120b  the FSDP notebook the same way, GPT_OSS_120B_NOTEBOOK_LAYERS layers (default 4), torch_compile True then False.
# --packing packs as the notebooks do: padding-free rows whose conversations attend only to themselves
# (nbhelpers.training.packing.mask_packed_sequences; before 2026-12-06 they attended to each other).
# Results: $RESULTS/gpt_oss/<run>.json, <run>.log, profile_*.txt, summary.txt.
# Carry .devsite (pack-site.sh notebook trl, pack-extra.sh); run: bash benchmarks/gpu/run.sh gpt_oss:560
# On a fresh machine the first compiled step alone takes over 2.5 minutes (Inductor's cache is empty; 2026-12-06, H100):
# "speed nb20b" then needs two calls; GPT_OSS_STAGES=nb20b alone fits one.
# CPU dry run of the script's logic: GPT_OSS_SIZE=tiny RESULTS=/tmp/r bash benchmarks/gpu/gpt_oss.sh
set -uo pipefail
out=$RESULTS/gpt_oss; mkdir -p "$out"
stages=" ${GPT_OSS_STAGES:-speed nb20b} "
size=${GPT_OSS_SIZE:-full}
steps=${GPT_OSS_STEPS:-12}
layers120=${GPT_OSS_120B_LAYERS:-8}
models=${TMPDIR:-/tmp}/gpt-oss-standins

run() {  # run NAME LIMIT ARGS...: one benchmark process, its log and its JSON under $out
  local name=$1 limit=$2; shift 2
  local started=$(date +%s)
  timeout "$limit" "$@" > "$out/$name.log" 2>&1
  printf '%s\trc=%s\t%d s\n' "$name" "$?" $(( $(date +%s) - started )) | tee -a "$out/stages.tsv"
  tail -n 2 "$out/$name.log"
}
bench=(python3 benchmarks/gpt_oss_speed.py --size "$size" --max_steps "$steps")
if [[ $stages == *" speed "* ]]; then
  run 20b_compiled_packed 240 "${bench[@]}" "$out/20b_compiled_packed.json" --packing --torch_compile \
    --profile "$out/profile_20b_compiled_packed"
  [[ $stages == *" eager "* ]] && run 20b_eager_packed 150 "${bench[@]}" "$out/20b_eager_packed.json" --packing
fi
if [[ $stages == *" padded "* ]]; then
  run 20b_eager_padded 150 "${bench[@]}" "$out/20b_eager_padded.json"
  run 20b_compiled_padded 200 "${bench[@]}" "$out/20b_compiled_padded.json" --torch_compile
fi
fsdp=(torchrun --nproc-per-node 1 benchmarks/gpt_oss_speed.py --size "$size" --model gpt-oss-120b --layers "$layers120"
      --packing)
if [[ $stages == *" fsdp "* ]]; then
  run 120b_compiled_packed 170 "${fsdp[@]}" --max_steps 8 "$out/120b_compiled_packed.json" --torch_compile \
    --profile "$out/profile_120b_compiled_packed"
  run 120b_eager_packed 130 "${fsdp[@]}" --max_steps 8 "$out/120b_eager_packed.json" \
    --profile "$out/profile_120b_eager_packed"
fi
if [[ $stages == *" fsdp_peft "* ]]; then
  run 120b_peft_eager_packed 130 "${fsdp[@]}" --max_steps 8 --peft_expert_lora "$out/120b_peft_eager_packed.json" \
    --profile "$out/profile_120b_peft_eager_packed"
fi
if [[ $stages == *" fsdp_batch8 "* ]]; then  # the same rows per step in micro-batches of 8 (4x fewer gathers)
  batch8=(--max_steps 7 --per_device_train_batch_size 8 --gradient_accumulation_steps 2)
  run 120b_batch8_compiled_packed 170 "${fsdp[@]}" "${batch8[@]}" "$out/120b_batch8_compiled_packed.json" --torch_compile
  run 120b_batch8_eager_packed 130 "${fsdp[@]}" "${batch8[@]}" "$out/120b_batch8_eager_packed.json"
fi
if [[ $stages == *" fsdp_attention "* ]]; then
  attention=(--max_steps 7 --attention_only_lora)
  run 120b_attention_lora_compiled_packed 140 "${fsdp[@]}" "${attention[@]}" \
    "$out/120b_attention_lora_compiled_packed.json" --torch_compile
  run 120b_attention_lora_eager_packed 110 "${fsdp[@]}" "${attention[@]}" "$out/120b_attention_lora_eager_packed.json"
fi
pm() {  # pm NOTEBOOK RUN -p ...: executed into $out/RUN.ipynb, output_dir $out/RUN
  local notebook=$1 name=$2; shift 2
  rm -rf "$out/$name"  # a run of an earlier call on this machine would be resumed from (2026-12-06: 0 steps left)
  local started=$(date +%s)
  timeout 330 python3 -m papermill --execution-timeout 600 --no-progress-bar "$notebook" "$out/$name.ipynb" \
    -p output_dir "$out/$name" -p num_gpus 1 -p dataset_name "$PWD/data/multilingual_thinking" -p max_steps 8 \
    -p merge_adapter False "$@" > "$out/$name.log" 2>&1
  printf '%s\trc=%s\t%d s\n' "$name" "$?" $(( $(date +%s) - started )) | tee -a "$out/stages.tsv"
  rm -rf "$out/$name/checkpoints"
}
weights=(--weights); [[ $size == tiny ]] && weights=()
mkdir -p "$models"
if [[ $stages == *" nb20b "* ]]; then
  [ -e "$models/gpt-oss-20b/config.json" ] ||
    python3 tests/standins.py make gpt-oss-20b --size "$size" "${weights[@]}" --mxfp4 --out "$models/gpt-oss-20b"
  echo "gradient_checkpointing: true" > "$out/checkpointing.yml"  # an SFTConfig field, through the notebook's config
  echo "gradient_checkpointing: false" > "$out/no_checkpointing.yml"
  declare -A nb20b=([compiled]="-p torch_compile True" [eager]="-p torch_compile False"
                    [compiled_checkpointing]="-p torch_compile True -p config $out/checkpointing.yml"
                    [compiled_no_checkpointing]="-p torch_compile True -p config $out/no_checkpointing.yml -p check_memory False")
  for run20 in ${GPT_OSS_NB20B_RUNS:-compiled eager}; do
    [[ -v nb20b[$run20] ]] || { echo "GPT_OSS_NB20B_RUNS: no run '$run20' (runs: ${!nb20b[*]})" >&2; continue; }
    pm notebooks/trl/ddp_gpt_oss_20b.ipynb "nb_20b_$run20" -p model_name_or_path "$models/gpt-oss-20b" ${nb20b[$run20]}
  done
fi
if [[ $stages == *" every2 "* ]]; then
  run 20b_every2_compiled_packed 200 python3 benchmarks/gpt_oss_speed.py --size "$size" \
    --max_steps "${GPT_OSS_EVERY2_STEPS:-5}" "$out/20b_every2_compiled_packed.json" --packing --torch_compile \
    --every_n_layers 2
fi
if [[ $stages == *" nb120b "* ]]; then
  python3 tests/standins.py make gpt-oss-120b --size "$size" "${weights[@]}" --mxfp4 \
    --layers "${GPT_OSS_120B_NOTEBOOK_LAYERS:-4}" --out "$models/gpt-oss-120b"
  pm notebooks/trl/fsdp_gpt_oss_120b.ipynb nb_120b_compiled -p model_name_or_path "$models/gpt-oss-120b" -p torch_compile True
  pm notebooks/trl/fsdp_gpt_oss_120b.ipynb nb_120b_eager -p model_name_or_path "$models/gpt-oss-120b" -p torch_compile False
  rm -rf "$models/gpt-oss-120b"
fi
python3 - "$out" <<'PY' | tee "$out/summary.txt"
import json, sys
from pathlib import Path
for path in sorted(Path(sys.argv[1]).glob("*.json")):
    r = json.loads(path.read_text())
    mfu = f"{r['mfu']:.1%}" if r.get("mfu") else "-"
    peak = f"{r['peak_memory_gib']:.1f} GiB" if r.get("peak_memory_gib") else "-"
    print(f"{path.stem:24s} {r['tokens_per_s']:9,.0f} tokens/s  MFU {mfu:>6s}  peak {peak:>10s}  "
          f"first step {r['first_step_s']:5.1f} s  {r['tokens_per_step']:8,.0f} tokens/step  "
          f"losses {' '.join(f'{x:.3f}' for x in r['losses'][:8])}")
PY
