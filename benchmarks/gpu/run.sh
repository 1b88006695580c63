#!/usr/bin/env bash
# Entry point on the lent GPU machine (see benchmarks/README.md):
#   bash benchmarks/gpu/run.sh TOPIC...      runs benchmarks/gpu/TOPIC.sh each, in order
# Unpacks the carried site dirs (.devsite/*.tar.gz), then leaves every result under
# $OUT/results.tgz (results/<topic>/..., results/<topic>.log, results/gpus.csv).
set -uo pipefail
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1 \
  AXOLOTL_DO_NOT_TRACK=1 RAY_USAGE_STATS_ENABLED=0 DO_NOT_TRACK=1 MPLBACKEND=Agg TOKENIZERS_PARALLELISM=false
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1  # multicast stays off
mkdir -p /tmp/site
for tarball in .devsite/*.tar.gz .devsite-ray/*.tar.gz; do [ -e "$tarball" ] && tar xzf "$tarball" -C /tmp/site; done
[ -d /tmp/site/bin ] && sed -i "1s|^#!.*python.*$|#!/usr/bin/env python3|" /tmp/site/bin/*  # their shebangs name the packing machine's python
export PYTHONPATH=$PWD:/tmp/site:${PYTHONPATH:-} PATH=/tmp/site/bin:$PATH
export RESULTS=/tmp/results
mkdir -p "$RESULTS"
nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv > "$RESULTS/gpus.csv"
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, 'gpus', torch.cuda.device_count())" | tee "$RESULTS/versions.txt"
for topic in "$@"; do
  started=$(date +%s)
  timeout "${TOPIC_TIMEOUT:-300}" bash "benchmarks/gpu/$topic.sh" > "$RESULTS/$topic.log" 2>&1
  rc=$?
  echo "== $topic: rc=$rc in $(( $(date +%s) - started )) s"; tail -n 15 "$RESULTS/$topic.log"
  # after each topic, so a timeout keeps what finished; figures, logs and executed notebooks only (the
  # runs' saved models and checkpoints are GBs, more than a call brings back)
  (cd /tmp && find results -type f -size -4M ! -name '*.safetensors' ! -name '*.bin' ! -name '*.pt' \
     ! -name '*.distcp' | tar czf "$OUT/results.tgz" -T -)
done
