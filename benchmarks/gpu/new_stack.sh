#!/usr/bin/env bash
# Issue 60's GPU evidence on ONE GPU: today's Hugging Face releases (the main lock's transformers, TRL, PEFT,
# accelerate, datasets, huggingface_hub and what they need) against the stack the GPU runs had before (the image's
# transformers 5.17 with the previous lock's TRL 1.15 and datasets 4.8), in the same call, one after the other:
#   nb20b   the GPT-OSS-20B notebook through papermill (benchmarks/gpu/gpt_oss.sh's nb20b stage, compiled)
#   long    the Qwen3.8-27B recipe, 12 layers on an H200 (as many as the planner fits), packed chat rows of 8,192
#           tokens (benchmarks/gpu/qwen35.sh's `tune long` stages; its work folder, tuned kernels included, is shared)
# Each stack runs the same commands; only PYTHONPATH differs: the old one is .devsite's (as run.sh unpacks it), the new
# one is .devsite-new/newstack.tar.gz (not unpacked by run.sh) in front of it. Results: $RESULTS/new_stack/{old,new}/
# and $RESULTS/new_stack/summary.txt (tokens/s of each run, new over old).
# Pack (on the CPU machine, from the project root):
#   git show 10a9af9:constraints.txt > /tmp/old-constraints.txt   # the lock before issue 60
#   PYTHON=.venv/bin/python CONSTRAINTS=/tmp/old-constraints.txt bash benchmarks/gpu/pack-site.sh notebook trl deepspeed
#   PYTHON=.venv/bin/python bash benchmarks/gpu/pack-extra.sh
#   PYTHON=.venv/bin/python bash benchmarks/gpu/pack-site.sh fla && mv .devsite/site.tar.gz .devsite/fla.tar.gz  # or PACK_OUT
#   PYTHON=.venv/bin/python PACK_OUT=.devsite-new/newstack.tar.gz bash benchmarks/gpu/pack-site.sh newstack trl
# Run: bash benchmarks/gpu/run.sh new_stack:580 (STACKS="new old" to change the order; NEW_STACK_RUNS="nb20b long")
set -uo pipefail
out=$RESULTS/new_stack; mkdir -p "$out"
[ -f .devsite-new/newstack.tar.gz ] || { echo "new_stack.sh: carry .devsite-new/newstack.tar.gz (see above)" >&2; exit 2; }
mkdir -p /tmp/site-new && tar xzf .devsite-new/newstack.tar.gz -C /tmp/site-new
runs=" ${NEW_STACK_RUNS:-nb20b long} "
base_path=$PYTHONPATH
for stack in ${STACKS:-old new}; do
  [ "$stack" = new ] && export PYTHONPATH=/tmp/site-new:$base_path || export PYTHONPATH=$base_path
  mkdir -p "$out/$stack"
  python3 -c "import transformers, trl, peft, accelerate; print('$stack:', *(f'{m.__name__} {m.__version__}' for m in
              (transformers, trl, peft, accelerate)))" | tee "$out/$stack/versions.txt"
  if [[ $runs == *" nb20b "* ]]; then
    RESULTS=$out/$stack GPT_OSS_STAGES=nb20b GPT_OSS_NB20B_RUNS=compiled bash benchmarks/gpu/gpt_oss.sh \
      > "$out/$stack/gpt_oss.log" 2>&1; echo "$stack nb20b: rc=$?"
  fi
  if [[ $runs == *" long "* ]]; then
    RESULTS=$out/$stack QWEN35_STAGES="tune long" bash benchmarks/gpu/qwen35.sh > "$out/$stack/qwen35.log" 2>&1
    echo "$stack long: rc=$?"
  fi
done
python3 - "$out" <<'PY' | tee "$out/summary.txt"
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
def rates(stack):  # tokens/s of every run's metrics.json under the stack's folder
    found = {}
    for path in sorted((out / stack).rglob("metrics.json")):
        metrics = json.loads(path.read_text())
        rate = metrics.get("tokens_per_s") or (metrics.get("results") or [{}])[0].get("tokens_per_s")
        if rate:
            found[str(path.parent.relative_to(out / stack))] = float(rate)
    return found
old, new = rates("old"), rates("new")
for name in sorted(set(old) | set(new)):
    ratio = f"{new[name] / old[name]:.3f}" if name in old and name in new else "-"
    print(f"{name}: old {old.get(name, '-')} tokens/s, new {new.get(name, '-')} tokens/s, new/old {ratio}")
PY
