#!/usr/bin/env bash
# Pack everything the Axolotl notebook needs on the GPU machine beyond its image, for ONE call: Axolotl's pinned
# stack, the kernel papermill runs the notebook in, and MLflow's client with its SQLite store, into
# .devsite/axolotl/site.tar.gz. That is a folder of its own, NOT one of the .devsite/*.tar.gz that run.sh unpacks for
# every topic: these versions (transformers 5.16.1, trl 1.9.0, peft 0.20.0, accelerate 1.13.0) would replace the
# machine's for the other topics. benchmarks/gpu/axolotl.sh unpacks it into /tmp/site-axolotl, first on PYTHONPATH for
# its runs only. Carry .devsite/axolotl/ alone (without the other .devsite packs): with the repository (~5 MB) it fits
# a call's 64 MiB; the script prints the size and fails above LIMIT_MB (default 58).
#
# The lists are what the notebook imports in its kernel, in `axolotl preprocess` and in `axolotl train` (LoRA,
# sample packing, MLflow, the plugins), found by recording sys.modules of every process of a CPU run and checked by
# running the CPU test with every other package hidden from the import system (2026-12-01), less what the GPU image
# (Python 3.12) has: torch 2.11 and its dependencies, numpy, pandas, pyarrow,
# requests, jinja2, pyyaml, psutil, click, pydantic, protobuf, and, found there on 2026-11-30 (SKIP below),
# numba, llvmlite, scipy, scikit-learn, tokenizers, huggingface_hub, rich. Check the image with
#   python3 -c "import numba, llvmlite, scipy, sklearn, tokenizers, huggingface_hub, rich, matplotlib, psutil"
# and take out of SKIP what it lacks (installed sizes: llvmlite 173 MB, scipy 113, scikit-learn 51, numba 35).
# Usage: PYTHON=.venv/bin/python bash benchmarks/gpu/pack-axolotl.sh
set -euo pipefail
PY=${PYTHON:-python3}
AXOLOTL="axolotl==0.19.0 transformers==5.16.1 trl==1.9.0 peft==0.20.0 accelerate==1.13.0 datasets==4.8.4
  tokenizers==0.23.1 huggingface_hub==1.17.0 hf_xet==1.4.3 bitsandbytes==0.50.2
  torchao==0.17.0 liger-kernel==0.8.1 pydantic==2.12.5 pydantic-core==2.41.5 typing-inspection annotated-types
  pydantic-extra-types evaluate==0.4.1 posthog==6.7.11 nvidia-ml-py==12.560.30 kernels<0.17 kernels-data<0.17
  numba llvmlite scipy scikit-learn threadpoolctl joblib wandb addict fire termcolor fastcore colorama pycountry
  sentencepiece dill multiprocess xxhash backoff tabulate wcwidth narwhals distro rich pygments"
# Left out, tried but optional in these runs (6.6, 5.6 and 0.6 MB packed): mistral-common (Mistral tokenizers),
# zstandard (.zst data files), art (the banner)
# papermill and the kernel it starts: shared/device/pack-site.sh's `notebook` profile less its optional debugger
# (debugpy, 5 MB) and completer (jedi, parso: 2.8 MB), which IPython and ipykernel do without, and nbval
NOTEBOOK="papermill nbclient nbformat jupyter_client jupyter_core ipykernel ipython ipython_pygments_lexers pyzmq
  tornado traitlets comm matplotlib-inline prompt_toolkit pexpect ptyprocess stack_data executing asttokens pure_eval
  decorator fastjsonschema jsonschema jsonschema-specifications referencing rpds-py tenacity entrypoints nest_asyncio
  platformdirs"
# MLflow's client and its SQLite store (tracking, system metrics, logging and loading a transformers model): what
# `import mlflow` and those uses import (mlflow 3.17 imports fastapi and databricks-sdk when it is imported, and its
# SQLite store cryptography), less what only its server, its cloud stores or git metadata use (uvicorn, google-auth,
# gitpython). importlib-metadata stays at 9.1.0: 10.x needs `lazy_importer`, not packed here (a 2026-12-01 GPU run stopped there)
MLFLOW="mlflow-skinny==3.18.0 sqlalchemy alembic mako sqlparse cachetools opentelemetry-api opentelemetry-sdk
  opentelemetry-semantic-conventions opentelemetry-proto importlib-metadata==9.1.0 zipp fastapi starlette annotated-doc
  databricks-sdk python-dotenv httpx httpcore cryptography cffi pycparser"
SKIP=${SKIP-numba llvmlite scipy scikit-learn threadpoolctl joblib tokenizers huggingface_hub hf_xet rich pygments}
work=$(mktemp -d); mkdir -p .devsite/axolotl
py=(--python-version 3.12 --implementation cp --only-binary=:all: --no-deps)
plat=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64
      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64)
for p in $AXOLOTL $NOTEBOOK $MLFLOW; do
  [[ " ${SKIP} " == *" ${p%%[=<>]*} "* ]] && continue
  "$PY" -m pip download -q "${py[@]}" "${plat[@]}" -d "$work/dl" "$p" || echo "pack-axolotl: could not download $p" >&2
done
# axolotl.contribs (imported by `axolotl train`) comes as source only: pure Python, built into wheels here
"$PY" -m pip download -q --no-deps --no-binary :all: -d "$work/src" axolotl-contribs-lgpl==0.0.7 axolotl-contribs-mit==0.0.6
"$PY" -m pip wheel -q --no-deps --no-build-isolation -w "$work/dl" "$work"/src/*.tar.gz
"$PY" -m pip install -q --no-deps --no-compile --target "$work/site" "$work"/dl/*.whl "${py[@]}" "${plat[@]}"
find "$work/site/bitsandbytes" -name 'libbitsandbytes_*.so' ! -name '*cuda130*' -delete 2>/dev/null || true
rm -rf "$work/site/wandb/bin" "$work/site/pycountry/locales"  # wandb's Go service and pycountry's translations: unused here
rm -rf "$work/site/bin"  # console scripts with this machine's shebang: the notebook calls `python -m axolotl.cli.main`
find "$work/site" -name '__pycache__' -prune -exec rm -rf {} +
tar czf .devsite/axolotl/site.tar.gz -C "$work/site" .
du -h .devsite/axolotl/site.tar.gz; du -sh "$work/site"
for d in "$work"/site/*/; do du -s "$d"; done | sort -rn | head -12
rm -rf "$work"
size_mb=$(( $(stat -c %s .devsite/axolotl/site.tar.gz) / 1000000 ))
[ "$size_mb" -le "${LIMIT_MB:-58}" ] || { echo "pack-axolotl: ${size_mb} MB, over ${LIMIT_MB:-58}: with the repository it would not fit one call" >&2; exit 1; }
