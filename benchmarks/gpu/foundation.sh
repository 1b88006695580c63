#!/usr/bin/env bash
# Issue 2 evidence on the GPU machine: both foundation notebooks through papermill with NCCL on every
# GPU, once after CUDA was initialised in the kernel; and the launch-overhead benchmark with NCCL.
set -uo pipefail
out=$RESULTS/foundation; mkdir -p "$out"
pm() { python3 -m papermill --execution-timeout 300 --no-progress-bar "$@"; }

pm notebooks/00_getting_started.ipynb "$out/00_getting_started.ipynb" -p output_dir "$out/getting_started" > "$out/getting_started.log" 2>&1
pm notebooks/pytorch/ddp_mlp.ipynb "$out/ddp_mlp.ipynb" -p output_dir "$out/ddp_mlp" > "$out/ddp_mlp.log" 2>&1

# The same DDP notebook with CUDA initialised in the kernel first: a fork of the kernel would now fail.
python3 - "$out" <<'PY'
import sys, nbformat
nb = nbformat.read("notebooks/pytorch/ddp_mlp.ipynb", as_version=4)
cell = nbformat.v4.new_code_cell("import torch\nx = torch.ones(1, device='cuda')  # CUDA is now initialised in this kernel\nprint(torch.cuda.is_initialized())")
nb.cells.insert(1, cell)
nbformat.write(nb, f"{sys.argv[1]}/ddp_mlp_cuda_first_in.ipynb")
PY
pm "$out/ddp_mlp_cuda_first_in.ipynb" "$out/ddp_mlp_cuda_first.ipynb" -p output_dir "$out/ddp_mlp_cuda_first" > "$out/ddp_mlp_cuda_first.log" 2>&1
rm -f "$out/ddp_mlp_cuda_first_in.ipynb"

timeout 150 python3 benchmarks/launch_overhead.py --repeats 3 --out "$out/launch_overhead_gpu.json" > "$out/launch_overhead.log" 2>&1
for m in getting_started ddp_mlp ddp_mlp_cuda_first; do
  python3 -c "import json,sys; m=json.load(open('$out/$m/metrics.json')); print('$m', {k: m[k] for k in m if k in ('world_size','final_loss','params_identical_across_ranks','samples_per_s','error_named_rank')}, m['environment']['devices'])" || echo "$m: no metrics"
done
