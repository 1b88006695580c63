#!/usr/bin/env bash
# Pack the Python packages that the lent GPU machine lacks into one pruned tarball to carry there.
# The GPU machine (Python 3.12, torch/transformers/peft/accelerate/lightning preinstalled) reaches no
# registry, and a call carries at most 64 MiB, so big wheels are pruned (bitsandbytes keeps only its
# CUDA 13 library; unsloth drops its web "studio").
#
# Usage (from the project root):   PYTHON=.venv/bin/python bash benchmarks/gpu/pack-site.sh [PROFILE...]
#   PROFILE: notebook (papermill/nbclient/ipykernel...), trl, deepspeed, unsloth, ray, fla, newstack (the Hugging Face
#   stack of the lock over the GPU image's: transformers, PEFT, accelerate, huggingface_hub and what they need that
#   the image lacks; pure Python but hf-xet)   (default: notebook trl deepspeed)
# Writes .devsite/site.tar.gz (.gitignore keeps .devsite/ out of git; PACK_OUT=FILE writes FILE instead). Carry it to the GPU machine;
# benchmarks/gpu/run.sh unpacks every .devsite/*.tar.gz into /tmp/site and puts it on PYTHONPATH and PATH.
# Versions are those of a lock, CONSTRAINTS (default constraints.txt, the main environment's; the unsloth profile:
# CONSTRAINTS=environments/unsloth/constraints.txt), so the GPU runs test what the CPU tests test.
set -euo pipefail
PY=${PYTHON:-python3}   # building deepspeed needs a Python that has torch (the project's venv)
profiles=("$@"); [ ${#profiles[@]} -eq 0 ] && profiles=(notebook trl deepspeed)

declare -A PKGS
PKGS[notebook]="papermill nbclient nbformat jupyter_client jupyter_core ipykernel ipython ipython_pygments_lexers pyzmq tornado traitlets comm debugpy matplotlib-inline prompt_toolkit jedi parso pexpect ptyprocess stack_data executing asttokens pure_eval wcwidth decorator fastjsonschema jsonschema jsonschema-specifications referencing rpds-py tenacity entrypoints nest_asyncio platformdirs nbval"
PKGS[trl]="trl datasets dill multiprocess"
PKGS[deepspeed]="hjson pydantic pydantic-core annotated-types typing-inspection"
PKGS[unsloth]="unsloth==2026.10.9 unsloth_zoo==2026.10.9 bitsandbytes==0.50.2 tyro docstring-parser shtab typeguard cut_cross_entropy hf_transfer msgspec structlog json5 torchao"
PKGS[ray]="ray tensorboardX jsonschema jsonschema-specifications referencing rpds-py datasets dill multiprocess"   # ~44 MB; the Ray recipes' calls: pack-ray.sh
PKGS[fla]="fla-core==0.6.0 flash-linear-attention==0.6.0"   # pure Python (Triton kernels), 1.5 MB
PKGS[newstack]="transformers peft accelerate huggingface_hub hf-xet httpx2 httpcore2 truststore h11 kernels tomlkit typer"

pack=${PACK_OUT:-.devsite/site.tar.gz}; work=$(mktemp -d); mkdir -p "$(dirname "$pack")" "$work/site"
want=""; for p in "${profiles[@]}"; do want="$want ${PKGS[$p]}"; done
py=(--python-version 3.12 --implementation cp --only-binary=:all: --no-deps)
plat=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64
      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64)
for p in $want; do
  "$PY" -m pip download -q -c "${CONSTRAINTS:-constraints.txt}" "${py[@]}" "${plat[@]}" -d "$work/dl" "$p" || echo "pack-site: could not download $p" >&2
done
# deepspeed ships only as source: build a pure-Python wheel (its CUDA ops compile on first use there).
if [[ " ${profiles[*]} " == *" deepspeed "* ]]; then
  "$PY" -m pip download -q --no-deps --no-binary :all: -d "$work/src" deepspeed==0.19.8
  DS_BUILD_OPS=0 "$PY" -m pip wheel -q --no-deps --no-build-isolation -w "$work/dl" "$work"/src/deepspeed-*.tar.gz
fi
"$PY" -m pip install -q --no-deps --no-compile --target "$work/site" "$work"/dl/*.whl \
  --python-version 3.12 --implementation cp --only-binary=:all: "${plat[@]}"
# prune what the GPU machine never uses
find "$work/site/bitsandbytes" -name 'libbitsandbytes_*.so' ! -name '*cuda130*' -delete 2>/dev/null || true
rm -rf "$work/site/studio" "$work/site/unsloth/studio" "$work/site/ray/jars" 2>/dev/null || true
find "$work/site" -name '*.js.map' -delete
find "$work/site" -name '__pycache__' -prune -exec rm -rf {} + 
tar czf "$pack" -C "$work/site" .
du -h "$pack"; rm -rf "$work"
[ $(stat -c %s "$pack") -lt $((60*1024*1024)) ] || echo "pack-site: over 60 MiB; a call carries 64 MiB in all: pack fewer profiles" >&2
