#!/usr/bin/env bash
# Every notebook after the lesson rewrite (issue 31), through papermill with num_gpus=1 on ONE H200.
#   GROUP=pytorch  getting_started, ddp_mlp, fsdp2_transformer (300 steps, then the same command to 400: a resume),
#                  choose_your_technique, 01_sweeps_and_remote, 02_fast_steps and 03_surviving_failures (full-size
#                  Llama-3.2-1B stand-in; until issue 44 one notebook, performance_and_resilience); and ddp_retinanet
#                  and ddp_two_tower as of e48f795 (before the rewrite) and as now, with the same settings, one after
#                  the other: the loss curves side by side (before_after.json).
#   GROUP=llm      ddp_gpt_oss_20b (all 24 layers), fsdp_gpt_oss_120b (1 of 36 layers), deepspeed_llama_3_2_1b,
#                  the Unsloth notebook (full-size stand-ins, random weights), and the Axolotl notebook when its pack
#                  (.devsite/axolotl, benchmarks/gpu/pack-axolotl.sh) is on the machine.
# Three streams share the GPU in each group (topics.tsv in run.sh's results says so): losses, memory and "it runs
# with one rank" are the evidence here; a clean speed figure needs a topic of its own.
# Settings the notebooks no longer take as parameters go through their `config` file (SFTConfig fields).
# Writes $RESULTS/notebooks_1gpu/: NAME.ipynb (executed), NAME.log, NAME.json (metrics.json), runs.tsv, summary.json.
set -uo pipefail
: "${RESULTS:?set RESULTS (benchmarks/gpu/run.sh does)}"
out=$RESULTS/notebooks_1gpu; mkdir -p "$out"
work=${WORK:-/tmp/notebooks_1gpu}; runs=$work/runs; models=$work/standins; mkdir -p "$runs" "$models"
export PYTHONPATH=$PWD:${PYTHONPATH:-} MPLBACKEND=Agg PYTHONUNBUFFERED=1
data=$PWD/data
[ -f "$out/runs.tsv" ] || printf "name\texit_code\tseconds\n" > "$out/runs.tsv"

pm() {  # pm NAME NOTEBOOK [-p KEY VALUE ...]: execute into $out/NAME.ipynb, output_dir $runs/NAME (a later one wins)
  local name=$1 notebook=$2 t0=$SECONDS rc; shift 2
  python3 -m papermill -k python3 --cwd "${PM_CWD:-$PWD}" --no-progress-bar --log-output --execution-timeout 560 "$notebook" "$out/$name.ipynb" \
    -p output_dir "$runs/$name" -p num_gpus 1 "$@" > "$out/$name.log" 2>&1
  rc=$?
  printf "%s\t%s\t%s\n" "$name" "$rc" "$((SECONDS - t0))" >> "$out/runs.tsv"
  [ $rc -eq 0 ] || tail -n 25 "$out/$name.log"
  local dir=$runs/$name; for ((i = 1; i <= $#; i++)); do [ "${!i}" = output_dir ] && { j=$((i + 1)); dir=${!j}; }; done
  cp "$dir/metrics.json" "$out/$name.json" 2>/dev/null
  return $rc
}
config() { local name=$1; shift; printf '%s\n' "$@" > "$work/$name.yaml"; echo "$work/$name.yaml"; }  # config NAME 'KEY: VALUE' ...

before=${BEFORE:-$PWD/.devsite/before}  # the two notebooks and the package as of e48f795 (the copy there has no .git;
# the old notebooks run from that folder: a kernel imports from its working directory first):
# mkdir -p .devsite/before && git archive e48f795 nbhelpers notebooks/pytorch/ddp_retinanet.ipynb \
#   notebooks/lightning/ddp_two_tower.ipynb | tar x -C .devsite/before
pytorch_compare() {  # before and after the rewrite, the same settings; the old notebooks run with the old package
  python3 data/make_detection.py --out "$work/shapes" --train 4096 --val 64 --image-size 128 > /dev/null
  # 2 epochs of 4096 images in batches of 32 = 256 steps; the new notebook warms up over total // 6 = 42 steps
  PM_CWD=$before PYTHONPATH=$before:$PYTHONPATH pm retinanet_before "$before/notebooks/pytorch/ddp_retinanet.ipynb" -p dataset_name "$work/shapes" -p min_size 128 \
    -p max_size 128 -p per_device_train_batch_size 32 -p max_steps 256 -p warmup_steps 42 -p max_eval_samples 64 \
    -p save_steps 128
  pm retinanet_after notebooks/pytorch/ddp_retinanet.ipynb -p dataset_name "$work/shapes" -p image_size 128 \
    -p per_device_train_batch_size 32 -p num_train_epochs 2 -p max_eval_samples 64 -p dataloader_num_workers 4
}
two_tower_compare() {
  python3 data/make_ratings.py --out "$work/item_ratings.csv" --users 1000 --items 1000 --ratings-per-user 110 > /dev/null
  PM_CWD=$before PYTHONPATH=$before:$PYTHONPATH pm two_tower_before "$before/notebooks/lightning/ddp_two_tower.ipynb" -p dataset_name "$work/item_ratings.csv"
  pm two_tower_after notebooks/lightning/ddp_two_tower.ipynb -p dataset_name "$work/item_ratings.csv"
}
pytorch_rest() {
  pm getting_started notebooks/00_getting_started.ipynb
  pm ddp_mlp notebooks/pytorch/ddp_mlp.ipynb
  pm fsdp2_transformer notebooks/pytorch/fsdp2_transformer.ipynb -p max_steps 300
  pm fsdp2_transformer_resumed notebooks/pytorch/fsdp2_transformer.ipynb -p max_steps 400 \
    -p output_dir "$runs/fsdp2_transformer"  # the same output_dir again, further: resumes from its last checkpoint
  python3 -m papermill --no-progress-bar notebooks/choose_your_technique.ipynb "$out/choose_your_technique.ipynb" \
    -p output_dir "$runs/choose_your_technique" > "$out/choose_your_technique.log" 2>&1  # no GPU: the meta device
  printf "choose_your_technique\t%s\t-\n" $? >> "$out/runs.tsv"; cp "$runs/choose_your_technique/plan.csv" "$out/" 2>/dev/null
  pm sweeps notebooks/01_sweeps_and_remote.ipynb -p num_gpus 1
}
pytorch_guide() {
  python3 tests/standins.py make llama-3.2-1b --size full --weights --device cuda:0 --out "$models/llama-3.2-1b" > /dev/null
  pm fast_steps notebooks/02_fast_steps.ipynb -p model_name_or_path "$models/llama-3.2-1b" -p dataloader_num_workers 4
  pm surviving_failures notebooks/03_surviving_failures.ipynb -p model_name_or_path "$models/llama-3.2-1b"
  rm -rf "$runs/surviving_failures/resilience" "$models/llama-3.2-1b"
}

standin() {  # standin ARCH [LAYERS]: the published config (fewer layers where given), random weights
  local mxfp4=; [[ $1 == gpt-oss-* ]] && mxfp4=--mxfp4
  python3 tests/standins.py make "$1" --size full --weights --out "$models/$1" ${2:+--layers "$2"} $mxfp4 > /dev/null
}
gpt_oss_20b() {
  standin gpt-oss-20b 24 && pm gpt_oss_20b notebooks/trl/ddp_gpt_oss_20b.ipynb -p model_name_or_path "$models/gpt-oss-20b" \
    -p dataset_name "$data/multilingual_thinking" -p max_steps 8 -p merge_adapter False \
    -p config "$(config gpt_oss_20b 'save_steps: 4' 'logging_steps: 1')"
  rm -rf "$models/gpt-oss-20b" "$runs/gpt_oss_20b/checkpoints"
}
gpt_oss_120b() {
  standin gpt-oss-120b 1 && pm gpt_oss_120b notebooks/trl/fsdp_gpt_oss_120b.ipynb -p model_name_or_path "$models/gpt-oss-120b" \
    -p dataset_name "$data/multilingual_thinking" -p max_steps 6 -p config "$(config gpt_oss_120b 'save_steps: 100' 'logging_steps: 1')"
  rm -rf "$models/gpt-oss-120b" "$runs/gpt_oss_120b/checkpoints" "$runs/gpt_oss_120b/merged"
}
llm_small() {
  standin llama-3.2-1b && pm llama_zero3 notebooks/trl/deepspeed_llama_3_2_1b.ipynb -p model_name_or_path "$models/llama-3.2-1b" \
    -p dataset_name "$data/capybara" -p max_steps 6 -p config "$(config llama_zero3 'save_steps: 200' 'logging_steps: 1')"
  rm -rf "$models/llama-3.2-1b" "$runs/llama_zero3/checkpoints" "$runs/llama_zero3/final"
  standin llama-3.2-3b && UNSLOTH_COMPILE_LOCATION=$work/unsloth_cache pm unsloth notebooks/unsloth/ddp_llama_3_2_3b.ipynb \
    -p model_name_or_path "$models/llama-3.2-3b" -p dataset_name "$data/finetome" -p max_steps 10 \
    -p config "$(config unsloth 'save_steps: 5' 'logging_steps: 1')"
  rm -rf "$models/llama-3.2-3b" "$runs/unsloth/checkpoints"
}
llm_axolotl() {
  [ -f .devsite/axolotl/site.tar.gz ] && mkdir -p /tmp/site-axolotl && tar xzf .devsite/axolotl/site.tar.gz -C /tmp/site-axolotl
  [ -d /tmp/site-axolotl/axolotl ] || { echo "no Axolotl pack on this machine: the Axolotl notebook is left out"; return 0; }
  python3 tests/standins.py make olmo-3-7b --size full --weights --out "$models/olmo-3-7b" > /dev/null  # machine's transformers
  PYTHONPATH=/tmp/site-axolotl:$PYTHONPATH AXOLOTL_DO_NOT_TRACK=1 pm axolotl notebooks/axolotl/ddp_olmo3_7b.ipynb \
    -p model_name_or_path "$models/olmo-3-7b" -p dataset_name "$data/alpaca_messages/train.jsonl" -p max_steps 8
  rm -rf "$models/olmo-3-7b" "$runs/axolotl/lora-out/checkpoint-"*
}

stream() {  # stream STEP...: the steps one after the other, with a GPU lease folder of their own: launches lease
  # their GPUs host-wide (nbhelpers.launch.gpu_lease), so streams sharing the one GPU on purpose must not see each
  # other's
  local leases=$work/leases-$1; mkdir -p "$leases"
  for step in "$@"; do NBHELPERS_GPU_LEASE_DIR=$leases "$step"; done
}
case ${GROUP:-pytorch} in
  pytorch) stream pytorch_compare two_tower_compare & stream pytorch_rest & stream pytorch_guide & wait ;;
  llm) stream gpt_oss_20b gpt_oss_120b & stream llm_small & stream llm_axolotl & wait ;;
  # what the calls of 2026-12-02 held (10 minutes each): pytorch; then these two
  llm+compare) stream gpt_oss_20b gpt_oss_120b & stream llm_small & stream pytorch_compare two_tower_compare & wait ;;
  rest) stream gpt_oss_120b & stream llm_small & stream two_tower_compare & wait ;;
  owed) stream llm_small & stream llm_axolotl & wait ;;  # what those three calls left (benchmarks/README.md)
  axolotl) stream llm_axolotl ;;  # alone: its pack (.devsite/axolotl) fills a call's carry
  *) echo "GROUP is pytorch, llm, llm+compare, rest, owed or axolotl"; exit 2 ;;
esac
python3 benchmarks/gpu/notebooks_1gpu_summary.py "$out" | tee "$out/summary_${GROUP:-pytorch}.txt"
