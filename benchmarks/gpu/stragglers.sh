#!/usr/bin/env bash
# Issue 62 on ONE GPU (about 1 minute): the straggler report's NVML path. One @distributed(gpus=1) launch trains on
# the GPU for 30 s with StepTimes; benchmarks/gpu/stragglers_nvml.py checks that the launch read the GPU's SM clock,
# temperature and throttle reasons (NVML), timed the rank's forward passes with CUDA events, and printed no report
# (one rank cannot straggle). Run from the repository root, through run.sh (carry .devsite: nvidia-ml-py, cloudpickle,
# psutil come from benchmarks/gpu/pack-extra.sh and pack-site.sh):
#   bash benchmarks/gpu/run.sh stragglers:180
# Writes $RESULTS/stragglers/nvml.json.
set -uo pipefail
: "${RESULTS:?set RESULTS to the folder that receives the results}"
mkdir -p "$RESULTS/stragglers"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=index,name,clocks.sm,clocks.max.sm,temperature.gpu,clocks_event_reasons.active --format=csv \
  | tee "$RESULTS/stragglers/nvidia-smi-before.csv"
"${PYTHON:-python3}" benchmarks/gpu/stragglers_nvml.py "$RESULTS/stragglers/nvml.json" "${SECONDS_BUSY:-30}"
