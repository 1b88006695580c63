"""What the training code of the notebooks and recipes calls: settings, rank and device, checkpoints, records.

- params.py           `read_parameters()`: a notebook's `parameters` cell (and papermill's values), checked
- runtime.py          rank, world size, device and backend (`from nbhelpers import runtime as rt`)
- checkpoints.py      checkpoints a restart can trust: sealed with checksums, verified when resumed
- metrics.py          `metrics.json` (the tests' and benchmarks' record of a run) and MLflow's store
- hf.py               Hugging Face: finding models and datasets, tokens/s, LoRA adapters, TRL without a GPU
- axolotl_plugins.py  Axolotl plugins: its checkpoints sealed, its runs reproducible
"""
