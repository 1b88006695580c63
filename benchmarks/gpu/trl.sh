#!/usr/bin/env bash
# Issue 5 evidence on the 2x H200 machine: the three TRL notebooks through papermill, on random-weight
# stand-ins of the real architectures written here, side by side in one run (see trl.md); the GPT-OSS ones
# keep their experts in MXFP4 as the hub checkpoints do, and the notebooks dequantise them to bf16 on load:
#   1. GPT-OSS-20B LoRA SFT: tokens/s on 1 GPU vs 2 GPUs with DDP (goal >= 1.9x)
#   2. GPT-OSS-120B architecture, LoRA SFT with FSDP2 on 2 GPUs: per-GPU peak memory vs the unsharded size
#   3. Llama-3.2-1B full fine-tune: per-GPU peak memory and tokens/s, ZeRO-3 vs DDP, same micro-batch,
#      gradient checkpointing on (goal: ZeRO-3 <= 0.6x DDP's memory)
# Knobs (environment): TRL_20B_LAYERS (default 8 of 24), TRL_120B_LAYERS (default 4 of 36),
# TRL_STAGES (default "20b 120b llama"), TRL_MODELS (where the stand-ins go, default /tmp/trl-standins),
# TRL_SIZE (default full; "tiny" checks the script's logic on a CPU machine, where num_gpus 1/2 become CPU processes).
set -uo pipefail
out=$RESULTS/trl; mkdir -p "$out"
models=${TRL_MODELS:-/tmp/trl-standins}
layers_20b=${TRL_20B_LAYERS:-8}
layers_120b=${TRL_120B_LAYERS:-4}
# The seed's 4 micro-steps per optimizer step: DDP all-reduces once per step, and the ranks' uneven batches
# (conversations of different lengths) even out over 4 micro-steps; with 1, a 2-GPU step waits for the
# longer of two single batches (1.85x measured so on 2026-11-30: benchmarks/results/trl/summary.json).
accum_20b=${TRL_20B_ACCUM:-4}
steps_20b=${TRL_20B_STEPS:-8}
size=${TRL_SIZE:-full}
stages=" ${TRL_STAGES:-20b 120b llama} "
data=$PWD/data
: > "$out/stages.tsv"
python3 - <<'PY' | tee "$out/versions.txt"  # LoRA on the experts needs peft >= 0.17 (target_parameters); tested with 0.21
from importlib import metadata
for name in ("torch", "transformers", "trl", "peft", "accelerate", "deepspeed", "datasets", "papermill", "mlflow-skinny"):
    try:
        print(name, metadata.version(name))
    except metadata.PackageNotFoundError:
        print(name, "MISSING")
PY

stage() {  # stage NAME TIMEOUT FUNCTION ARGS...: run, log to $out/NAME.log, record rc and wall seconds
  local name=$1 limit=$2; shift 2
  local started=$(date +%s%N)
  timeout "$limit" bash -c '"$@"' bash "$@" > "$out/$name.log" 2>&1
  local rc=$?
  printf '%s\trc=%s\t%d s\n' "$name" "$rc" $(( ($(date +%s%N) - started) / 1000000000 )) | tee -a "$out/stages.tsv"
}
pm() {  # pm NOTEBOOK RUN_NAME -p ...: execute a notebook into $out/RUN_NAME.ipynb, metrics in $out/RUN_NAME/
  local notebook=$1 name=$2; shift 2
  python3 -m papermill --execution-timeout 280 --no-progress-bar "$notebook" "$out/$name.ipynb" \
    -p output_dir "$out/$name" -p mlflow_tracking_uri "sqlite:///$out/$name/mlflow.db" "$@"
}

# Stand-ins: real configs (fewer layers where said), random weights generated on the GPUs.
make_standin() {  # make_standin ARCH DEVICE [LAYERS]
  local mxfp4=; [[ $1 == gpt-oss-* ]] && mxfp4=--mxfp4  # as on the hub: 20B 14 GB, 120B 65 GB at full depth
  if [[ $size == tiny ]]; then python3 -m nbhelpers.standins make "$1" --size tiny --out "$models/$1" $mxfp4; return; fi
  python3 -m nbhelpers.standins make "$1" --size full --weights --device "$2" --out "$models/$1" ${3:+--layers "$3"} $mxfp4
}
export out models size
export -f pm make_standin
[[ $stages == *" 20b "* ]] && stage build_gpt_oss_20b 300 make_standin gpt-oss-20b cuda:0 "$layers_20b" &
[[ $stages == *" 120b "* ]] && stage build_gpt_oss_120b 300 make_standin gpt-oss-120b cuda:1 "$layers_120b" &
[[ $stages == *" llama "* ]] && stage build_llama_3_2_1b 300 make_standin llama-3.2-1b cuda:0 &
wait
du -sh "$models"/* | tee "$out/standin_sizes.txt"

if [[ $stages == *" 20b "* ]]; then
  common=(-p model_name "$models/gpt-oss-20b" -p dataset_name "$data/multilingual_thinking" -p dataset_split "train[:384]"
          -p max_length 512 -p per_device_train_batch_size 16 -p gradient_accumulation_steps "$accum_20b"
          -p max_steps "$steps_20b" -p logging_steps 1 -p timing_warmup_steps 2)
  stage ddp_20b_1gpu 300 pm notebooks/trl/ddp_gpt_oss_20b.ipynb ddp_20b_1gpu "${common[@]}" -p num_gpus 1 -p max_new_tokens 0
  stage ddp_20b_2gpu 300 pm notebooks/trl/ddp_gpt_oss_20b.ipynb ddp_20b_2gpu "${common[@]}" -p num_gpus 2 -p max_new_tokens 32
fi
if [[ $stages == *" 120b "* ]]; then
  stage fsdp_120b_2gpu 300 pm notebooks/trl/fsdp_gpt_oss_120b.ipynb fsdp_120b_2gpu -p num_gpus 2 \
    -p model_name "$models/gpt-oss-120b" -p dataset_name "$data/multilingual_thinking" -p dataset_split "train[:128]" \
    -p max_length 512 -p per_device_train_batch_size 4 -p gradient_accumulation_steps 1 -p max_steps 8 \
    -p logging_steps 1 -p timing_warmup_steps 2
fi
if [[ $stages == *" llama "* ]]; then
  common=(-p model_name "$models/llama-3.2-1b" -p dataset_name "$data/capybara" -p train_split "train[:384]"
          -p eval_split "test[:16]" -p max_length 512 -p per_device_train_batch_size 16 -p gradient_accumulation_steps 1
          -p max_steps 12 -p eval_steps 1000 -p logging_steps 1 -p timing_warmup_steps 2 -p gradient_checkpointing True
          -p max_new_tokens 16 -p num_gpus 2)
  stage llama_zero3_2gpu 300 pm notebooks/trl/deepspeed_llama_3_2_1b.ipynb llama_zero3_2gpu "${common[@]}" -p zero_stage 3
  stage llama_ddp_2gpu 300 pm notebooks/trl/deepspeed_llama_3_2_1b.ipynb llama_ddp_2gpu "${common[@]}" -p zero_stage 0
fi

python3 benchmarks/gpu/trl_summary.py "$out" --layers-20b "$layers_20b" --layers-120b "$layers_120b" --models "$models" | tee "$out/summary.txt"
