#!/usr/bin/env bash
# The TRL notebooks on ONE H200, through papermill, on random-weight stand-ins written here (no hub there):
# issue 16 (every notebook with num_gpus 1), issue 21 §3 (GPT-OSS-20B at full depth), issue 18 (a resume and
# a merge on the GPU). Stages, in this order, chosen with TRL_STAGES (see trl.md for what each records):
#   20b         GPT-OSS-20B, all 24 layers (MXFP4 stand-in, ~14 GB, dequantised to ~42 GB bf16 on load), the DDP
#               notebook with num_gpus 1 and its defaults (batch 4 x 4, max_length 2048, checkpointing), 12 steps:
#               killed right after its first checkpoint (step 4) and rerun, which resumes; then tokens/s, peak
#               memory beside the planner's estimate, loss, adapter reload + answer, the merged model (42 GB of
#               bf16 safetensors) reloaded and compared with base + adapter.                          ~6 min
#   llama_1gpu  the ZeRO-3 notebook, num_gpus 1, full-size Llama-3.2-1B stand-in, its defaults, 6 steps. ~2 min
#   120b_1gpu   the FSDP notebook, num_gpus 1, full-width GPT-OSS-120B stand-in with 1 of its 36 layers
#               (all 128 experts, MXFP4), its defaults, 6 steps.                                      ~2.5 min
# On a machine with 2 GPUs (issue 23; not in the default): 2gpu_20b (the DDP notebook on 1 GPU, then 2, same
# batch: scaling), 2gpu_120b (the FSDP notebook on 2 GPUs: memory per GPU vs unsharded), 2gpu_llama (ZeRO-3 vs DDP).
# Knobs (environment): TRL_STAGES (default "20b llama_1gpu 120b_1gpu"), TRL_MODELS (stand-ins, default
# /tmp/trl-standins), TRL_120B_LAYERS (default 1; 2gpu_120b: 4), TRL_20B_2GPU_LAYERS (default 24), TRL_SIZE (default
# full; "tiny" checks the script's logic on a CPU machine: tiny stand-ins, CPU processes). Every stage deletes the
# tens of GB it wrote once it has its figures.
set -uo pipefail
out=$RESULTS/trl; mkdir -p "$out"
models=${TRL_MODELS:-/tmp/trl-standins}
size=${TRL_SIZE:-full}
stages=" ${TRL_STAGES:-20b llama_1gpu 120b_1gpu} "
data=$PWD/data
: > "$out/stages.tsv"
python3 - <<'PY' | tee "$out/versions.txt"  # LoRA on the experts needs peft >= 0.17 (target_parameters)
from importlib import metadata
for name in ("torch", "transformers", "trl", "peft", "accelerate", "deepspeed", "datasets", "papermill", "mlflow-skinny",
             "nvidia-ml-py"):
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
pm() {  # pm NOTEBOOK RUN -p ...: execute into $out/RUN.ipynb with output_dir $out/RUN (a later -p output_dir wins);
  local notebook=$1 name=$2; shift 2  # MLflow: the notebooks' default store, $out/mlflow.db, one for all runs
  python3 -m papermill --execution-timeout 600 --no-progress-bar "$notebook" "$out/$name.ipynb" \
    -p output_dir "$out/$name" "$@"
}
make_standin() {  # make_standin ARCH [LAYERS]: real config (fewer layers where given), random weights made on the GPU
  local mxfp4=; [[ $1 == gpt-oss-* ]] && mxfp4=--mxfp4  # experts in MXFP4, as on the hub
  if [[ $size == tiny ]]; then python3 tests/standins.py make "$1" --size tiny --out "$models/$1" $mxfp4; return; fi
  python3 tests/standins.py make "$1" --size full --weights --out "$models/$1" ${2:+--layers "$2"} $mxfp4
  du -sh "$models/$1" | tee -a "$out/standin_sizes.txt"
}
gpt_oss_20b() {
  make_standin gpt-oss-20b 24 || return 1
  # the planner's estimate for this run, beside the measured peak (summary): LoRA r=8, 4 sequences per micro-step,
  # checkpointing, eager attention; at max_length (2048) and at the data's length (about 256 tokens)
  for seq in 2048 256; do
    python3 -m nbhelpers.planner gpt-oss-20b --gpus 1 --gpu-memory 140.4 --lora-rank 8 --seq-len $seq --micro-batch 4 \
      --checkpointing --attention eager > "$out/plan_gpt_oss_20b_seq$seq.txt" 2>&1
  done
  local run=(notebooks/trl/ddp_gpt_oss_20b.ipynb -p num_gpus 1 -p model_name_or_path "$models/gpt-oss-20b"
             -p dataset_name "$data/multilingual_thinking" -p max_steps 12 -p save_steps 4 -p max_new_tokens 128
             -p output_dir "$out/20b_1gpu")
  # the first run dies right after its first sealed checkpoint (the tests' hook: SIGKILL, no clean-up runs) ...
  PYTHONPATH=$PWD/tests/hooks:$PYTHONPATH COOKBOOK_TEST_HOOKS=kill_rank_after_checkpoint=1 \
    COOKBOOK_TEST_HOOKS_DIR=$out/20b_1gpu_hooks pm "${run[0]}" 20b_1gpu_killed "${run[@]:1}"
  ls "$out/20b_1gpu/checkpoints" > "$out/20b_1gpu_checkpoints_after_kill.txt"
  # ... and the same command again continues from it, trains to the end, answers, merges
  pm "${run[0]}" 20b_1gpu "${run[@]:1}"
  local rc=$?
  du -sh "$out/20b_1gpu/merged" > "$out/20b_1gpu_merged_size.txt" 2>&1
  rm -rf "$out/20b_1gpu/merged" "$out/20b_1gpu/checkpoints" "$models/gpt-oss-20b"  # 42 + 14 GB
  return $rc
}
llama_1gpu() {
  make_standin llama-3.2-1b || return 1
  pm notebooks/trl/deepspeed_llama_3_2_1b.ipynb llama_1gpu -p num_gpus 1 -p model_name_or_path "$models/llama-3.2-1b" \
    -p dataset_name "$data/capybara" -p max_steps 6 -p logging_steps 1
  local rc=$?
  rm -rf "$out/llama_1gpu/checkpoints" "$out/llama_1gpu/final" "$models/llama-3.2-1b"  # a ZeRO-3 checkpoint: ~17 GB
  return $rc
}
gpt_oss_120b_1gpu() {
  make_standin gpt-oss-120b "${TRL_120B_LAYERS:-1}" || return 1
  pm notebooks/trl/fsdp_gpt_oss_120b.ipynb 120b_1gpu -p num_gpus 1 -p model_name_or_path "$models/gpt-oss-120b" \
    -p dataset_name "$data/multilingual_thinking" -p max_steps 6
  local rc=$?
  rm -rf "$out/120b_1gpu/merged" "$out/120b_1gpu/checkpoints" "$models/gpt-oss-120b"
  return $rc
}
two_gpus_20b() {  # 1 GPU then 2, the same batch per GPU; 4 micro-steps per step even out the ranks' uneven batches
  make_standin gpt-oss-20b "${TRL_20B_2GPU_LAYERS:-24}" || return 1
  local run=(notebooks/trl/ddp_gpt_oss_20b.ipynb -p model_name_or_path "$models/gpt-oss-20b" -p dataset_name
             "$data/multilingual_thinking" -p dataset_train_split "train[:384]" -p max_length 512
             -p per_device_train_batch_size 16 -p max_steps 8 -p save_steps 100 -p merge_adapter False)
  pm "${run[0]}" 20b_1of2gpu "${run[@]:1}" -p num_gpus 1 -p max_new_tokens 0
  pm "${run[0]}" 20b_2gpu "${run[@]:1}" -p num_gpus 2 -p max_new_tokens 32
  rm -rf "$out"/20b_*gpu/checkpoints "$models/gpt-oss-20b"
}
two_gpus_120b() {
  make_standin gpt-oss-120b "${TRL_120B_LAYERS:-4}" || return 1
  pm notebooks/trl/fsdp_gpt_oss_120b.ipynb 120b_2gpu -p num_gpus 2 -p model_name_or_path "$models/gpt-oss-120b" \
    -p dataset_name "$data/multilingual_thinking" -p dataset_train_split "train[:128]" -p max_length 512 \
    -p per_device_train_batch_size 4 -p gradient_accumulation_steps 1 -p max_steps 8 -p max_new_tokens 0 \
    -p merge_adapter False
  rm -rf "$out/120b_2gpu/checkpoints" "$models/gpt-oss-120b"
}
two_gpus_llama() {  # ZeRO-3 vs plain DDP, same micro-batch, checkpointing on
  make_standin llama-3.2-1b || return 1
  local run=(notebooks/trl/deepspeed_llama_3_2_1b.ipynb -p num_gpus 2 -p model_name_or_path "$models/llama-3.2-1b"
             -p dataset_name "$data/capybara" -p dataset_train_split "train[:384]" -p dataset_test_split "test[:16]"
             -p max_length 512 -p per_device_train_batch_size 16 -p gradient_accumulation_steps 1 -p max_steps 12
             -p eval_steps 1000 -p save_steps 1000 -p logging_steps 1 -p max_new_tokens 16)
  pm "${run[0]}" llama_zero3_2gpu "${run[@]:1}" -p zero_stage 3
  pm "${run[0]}" llama_ddp_2gpu "${run[@]:1}" -p zero_stage 0
  rm -rf "$out"/llama_*_2gpu/{checkpoints,final} "$models/llama-3.2-1b"
}
export out models size data
export -f pm make_standin gpt_oss_20b llama_1gpu gpt_oss_120b_1gpu two_gpus_20b two_gpus_120b two_gpus_llama

[[ $stages == *" 20b "* ]] && stage 20b 480 gpt_oss_20b
[[ $stages == *" llama_1gpu "* ]] && stage llama_1gpu 200 llama_1gpu
[[ $stages == *" 120b_1gpu "* ]] && stage 120b_1gpu 240 gpt_oss_120b_1gpu
[[ $stages == *" 2gpu_20b "* ]] && stage 2gpu_20b 480 two_gpus_20b
[[ $stages == *" 2gpu_120b "* ]] && stage 2gpu_120b 300 two_gpus_120b
[[ $stages == *" 2gpu_llama "* ]] && stage 2gpu_llama 300 two_gpus_llama
python3 benchmarks/gpu/trl_summary.py "$out" | tee "$out/summary.txt"
