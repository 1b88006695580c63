"""The launcher: run a function on every GPU of the node (or of a Ray cluster), or a command line, from a cell.

- launcher.py        `@distributed`, the decorator (`from nbhelpers import distributed`): checks, restarts
- local_engine.py    the ranks as processes on this host, forked from a clean server (_worker.py runs in each)
- ray_engine.py      the ranks as actors on the nodes of a Ray cluster (`engine="ray"`, `remote=True`)
- engine_core.py     what both engines share: the error, the torchrun environment, output, stalls, clean-up
- payload.py         what travels to a rank (the call, by value) and back (its Outcome)
- gpu_lease.py       host-wide GPU leases: launches running at once get disjoint GPUs
- system_metrics.py  CPU, memory and GPU use of the ranks while they run (GPU clocks and temperature too)
- stragglers.py      which rank held the others back, and why: the one line at the end of a launch
- ray_launcher.py    `@ray_launch`: a function that drives Ray itself (`from nbhelpers import ray_launch`)
- commands.py        `run_command`: a command line (torchrun, `axolotl train`) with its output in the cell

Ray is optional (`pip install ".[ray]"`): only ray_engine.py and ray_launcher.py use it, when a Ray launch runs
(engine_core.import_ray, which says how to install Ray where it is missing); `import nbhelpers` loads neither.
"""
