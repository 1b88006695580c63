#!/usr/bin/env bash
# Pack Python packages the GPU machine lacks beyond benchmarks/gpu/pack-site.sh's profiles
# (today: MLflow's client, its SQLite store and pydantic, which MLflow imports and the image lacks; nvidia-ml-py,
# which MLflow's GPU system metrics read; pycocotools, which the RetinaNet notebook scores with) into
# .devsite/extra.tar.gz, skipping what the machine's image already has.
# Usage: PYTHON=.venv/bin/python bash benchmarks/gpu/pack-extra.sh      (PACK_OUT=FILE: write FILE instead)
set -euo pipefail
PY=${PYTHON:-python3}
ON_IMAGE="numpy matplotlib contourpy cycler fonttools kiwisolver pillow pyparsing python_dateutil six anyio annotated_doc certifi charset_normalizer click cloudpickle h11 idna markupsafe packaging protobuf pyyaml requests typing_extensions urllib3 zipp"
work=$(mktemp -d)
"$PY" -m pip download -q -c constraints.txt mlflow-skinny sqlalchemy alembic nvidia-ml-py pycocotools --python-version 3.12 --implementation cp \
  --only-binary=:all: --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$work/dl"
for name in $ON_IMAGE; do rm -f "$work"/dl/${name}-[0-9]*.whl; done
"$PY" -m pip install -q --no-deps --no-compile --target "$work/site" "$work"/dl/*.whl --python-version 3.12 \
  --implementation cp --only-binary=:all: --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64
find "$work/site" -name '__pycache__' -prune -exec rm -rf {} +
pack=${PACK_OUT:-.devsite/extra.tar.gz}
mkdir -p "$(dirname "$pack")" && tar czf "$pack" -C "$work/site" . && du -h "$pack" && rm -rf "$work"
