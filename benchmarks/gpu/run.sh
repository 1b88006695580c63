#!/usr/bin/env bash
# Entry point on the lent GPU machine (see benchmarks/README.md):
#   bash benchmarks/gpu/run.sh TOPIC...      runs benchmarks/gpu/TOPIC.sh each, in order
# A TOPIC may carry its own time limit and a delay, NAME[:SECONDS][@DELAY] (default TOPIC_TIMEOUT, else 300 s),
# and topics joined by '+' run at the same time (one GPU shared): "one_gpu:420+sweeps:300@75" starts sweeps 75 s
# after one_gpu. Only evidence that needs no clean figure should share the GPU: results/topics.tsv records when
# each topic ran, so a figure made beside another run is never taken for a clean one.
# Unpacks the carried site dirs (.devsite/*.tar.gz), then leaves every result under
# $OUT/results.tgz (results/<topic>/..., results/<topic>.log, results/gpus.csv, results/topics.tsv).
set -uo pipefail
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1 \
  AXOLOTL_DO_NOT_TRACK=1 RAY_USAGE_STATS_ENABLED=0 DO_NOT_TRACK=1 MPLBACKEND=Agg TOKENIZERS_PARALLELISM=false
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1  # multicast stays off
mkdir -p /tmp/site
for tarball in .devsite/*.tar.gz .devsite-ray/*.tar.gz; do [ -e "$tarball" ] && tar xzf "$tarball" -C /tmp/site; done
[ -d /tmp/site/bin ] && sed -i "1s|^#!.*python.*$|#!/usr/bin/env python3|" /tmp/site/bin/*  # their shebangs name the packing machine's python
export PYTHONPATH=$PWD:$PWD/tests:/tmp/site:${PYTHONPATH:-} PATH=/tmp/site/bin:$PATH  # tests/: the stand-ins
export RESULTS=/tmp/results
mkdir -p "$RESULTS"
nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv > "$RESULTS/gpus.csv"
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, 'gpus', torch.cuda.device_count())" | tee "$RESULTS/versions.txt"
run_topic() {  # NAME LIMIT DELAY: run one topic, log it, record when it ran and how it ended
  local name=$1 limit=$2 delay=$3
  sleep "$delay"
  local started=$(date +%s)
  timeout "$limit" bash "benchmarks/gpu/$name.sh" > "$RESULTS/$name.log" 2>&1
  local rc=$?
  printf '%s\trc=%s\tstarted=%s\tended=%s\t%s s\n' "$name" "$rc" "$(date -u -d @"$started" +%T)" "$(date -u +%T)" \
    "$(( $(date +%s) - started ))" | tee -a "$RESULTS/topics.tsv"
  tail -n 15 "$RESULTS/$name.log" | sed "s/^/  [$name] /"
  pack_results
}
pack_results() {  # after each topic, so a call cut short keeps what finished; figures, logs and executed notebooks
  # only (the runs' saved models and checkpoints are GBs, more than a call brings back)
  (flock 9; cd /tmp && find results -type f -size -4M ! -name '*.safetensors' ! -name '*.bin' ! -name '*.pt' \
     ! -name '*.distcp' | tar czf "$OUT/results.tgz.part" -T - && mv "$OUT/results.tgz.part" "$OUT/results.tgz") 9> /tmp/results.lock
}
for group in "$@"; do
  IFS=+ read -ra topics <<< "$group"
  for spec in "${topics[@]}"; do
    name=${spec%%[:@]*}; limit=${TOPIC_TIMEOUT:-300}; delay=0
    [[ $spec == *:* ]] && { limit=${spec#*:}; limit=${limit%%@*}; }
    [[ $spec == *@* ]] && delay=${spec#*@}
    run_topic "$name" "$limit" "$delay" &
  done
  wait
  [ ${#topics[@]} -gt 1 ] && echo "at the same time on one GPU: ${topics[*]}" >> "$RESULTS/topics.tsv"
  pack_results
done
