#!/usr/bin/env bash
# Pack what the Ray recipes need on the lent GPU machine into .devsite-ray/ray.tar.gz (git-ignored), which
# benchmarks/gpu/run.sh unpacks as it does .devsite's: Ray with what it imports and the image lacks (pack-site.sh ray:
# jsonschema, and Datasets, which the Qwen2.5 recipe reads its rows with), and MLflow's client with its SQLite store
# and pydantic (pack-extra.sh), which Ray Train imports too and the recipes log to. Together they pack to ~64 MB, more
# than one call carries beside the working tree (64 MiB in all), so what the recipes never load goes (RLlib, Serve,
# Ray's LLM library, the dashboard's web UI, pycocotools, google-auth) and the binaries lose their symbol tables
# (strip --strip-unneeded): ~52 MB. Carry it alone: carry [".devsite-ray"], for `run.sh ray` and
# `STAGES=recipe ... run.sh resnet_data`.
# Usage (from the project root): PYTHON=.venv/bin/python bash benchmarks/gpu/pack-ray.sh
set -euo pipefail
work=$(mktemp -d)
PACK_OUT="$work/ray.tar.gz" bash benchmarks/gpu/pack-site.sh ray
PACK_OUT="$work/extra.tar.gz" bash benchmarks/gpu/pack-extra.sh
mkdir "$work/site"
tar xzf "$work/ray.tar.gz" -C "$work/site" && tar xzf "$work/extra.tar.gz" -C "$work/site"
(cd "$work/site" && rm -rf ray/rllib ray/serve ray/llm ray/dashboard/client/build pycocotools* google pyasn1* google_auth* \
   && find . -name '*.so' -size +500k -exec strip --strip-unneeded {} + \
   && strip --strip-unneeded ray/core/src/ray/raylet/raylet ray/core/src/ray/gcs/gcs_server)
mkdir -p .devsite-ray && tar czf .devsite-ray/ray.tar.gz -C "$work/site" . && du -h .devsite-ray/ray.tar.gz
rm -rf "$work"
