#!/usr/bin/env bash
# Pack Axolotl's pinned stack for the GPU machine (Python 3.12; torch 2.11, numpy, pyarrow, pandas, requests,
# jinja2, pyyaml... on the image) into .devsite/axolotl/site.tar.gz: a folder of its own, NOT one of the
# .devsite/*.tar.gz that run.sh unpacks for every topic, because these versions (transformers 5.16.1,
# trl 1.9.0, peft 0.20.0, accelerate 1.13.0) would replace the machine's for the other topics.
# benchmarks/gpu/axolotl.sh unpacks it into /tmp/site-axolotl, first on PYTHONPATH for its runs only.
# The list is what `axolotl preprocess` + `axolotl train` (LoRA and QLoRA, sample packing, MLflow) import,
# found by recording sys.modules of a CPU run. Usage: PYTHON=.venv/bin/python bash benchmarks/gpu/pack-axolotl.sh
# SKIP="numba llvmlite scipy ..." leaves out packages the GPU image already has (check there first with
# python3 -c "import numba, llvmlite, scipy, sklearn, wandb, pycountry"). Installed sizes (Python 3.11 here):
# llvmlite 173 MB, transformers 117, scipy 113, wandb 62, scikit-learn 51, mistral_common 37, numba 35,
# torchao 25, pycountry 23, axolotl 15, bitsandbytes ~8 once pruned to CUDA 13: the whole set does not
# fit a 64 MiB carry unless the image has llvmlite/numba/scipy/scikit-learn; the script prints the size.
set -euo pipefail
PY=${PYTHON:-python3}
PINNED="axolotl==0.19.0 transformers==5.16.1 trl==1.9.0 peft==0.20.0 accelerate==1.13.0 datasets==4.8.4
  axolotl-contribs-lgpl axolotl-contribs-mit tokenizers==0.23.1 huggingface_hub==1.17.0 hf_xet==1.4.3 bitsandbytes==0.50.2 torchao==0.17.0 liger-kernel==0.8.1
  pydantic==2.12.5 mistral-common==1.11.5 evaluate==0.4.1 posthog==6.7.11 nvidia-ml-py==12.560.30 kernels<0.17 kernels-data<0.17
  numba llvmlite scipy scikit-learn threadpoolctl joblib wandb addict fire termcolor fastcore colorama art
  pydantic-core==2.41.5 typing-inspection annotated-types pydantic-extra-types pycountry sentencepiece dill multiprocess xxhash zstandard backoff
  tabulate wcwidth narwhals distro rich pygments mlflow-skinny sqlalchemy alembic"
work=$(mktemp -d); mkdir -p .devsite/axolotl
py=(--python-version 3.12 --implementation cp --only-binary=:all: --no-deps)
plat=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64
      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64)
for p in $PINNED; do
  [[ " ${SKIP:-} " == *" ${p%%[=<>]*} "* ]] && continue
  "$PY" -m pip download -q "${py[@]}" "${plat[@]}" -d "$work/dl" "$p" || echo "pack-axolotl: could not download $p" >&2
done
"$PY" -m pip install -q --no-deps --no-compile --target "$work/site" "$work"/dl/*.whl "${py[@]}" "${plat[@]}"
find "$work/site/bitsandbytes" -name 'libbitsandbytes_*.so' ! -name '*cuda130*' -delete 2>/dev/null || true
rm -rf "$work/site/wandb/bin" "$work/site/pycountry/locales"  # wandb's Go service and pycountry's translations: unused here
rm -rf "$work/site/bin"  # console scripts with this machine's shebang: the notebook calls `python -m axolotl.cli.main`
find "$work/site" -name '__pycache__' -prune -exec rm -rf {} +
tar czf .devsite/axolotl/site.tar.gz -C "$work/site" .
du -h .devsite/axolotl/site.tar.gz; du -sh "$work/site"
for d in "$work"/site/*/; do du -s "$d"; done | sort -rn | head -12
rm -rf "$work"
