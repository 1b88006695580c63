"""The launcher: run a function on every GPU of the node (or of a Ray cluster), or a command line, from a cell.

A file answers one question:
- launcher.py        `@distributed`, the decorator (`from nbhelpers import distributed`): its checks, restarts
- databricks.py      Databricks' spellings: num_accelerators, accelerator_type shapes, with_overrides, timeout
- gpus.py            how many ranks, on which GPUs: every check of `gpus` and `gpu_type`, on this host or a Ray cluster
- local_engine.py    the ranks as processes on this host: the launch loop (start, watch, blame, stop), top to bottom
- fork_server.py     the clean server every local rank is forked from (torch imported, CUDA untouched); a rank's setup
- ray_engine.py      the ranks as actors on the nodes of a Ray cluster (`engine="ray"`, `remote=True`)
- errors.py          how a launch fails, in words: DistributedError and its texts (the rank, how it ended, its peers)
- output.py          what the ranks say: their output in the cell, `[rank N]`, and their logs (MLflow logs/rank_N)
- stalls.py          when a rank counts as stalled, and the report with every rank's Python stack
- processes.py       the torchrun environment (a plain call's too), the rendezvous port on loopback, stopping every
                     process of a launch
- payload.py         what travels to a rank (the call, by value) and back (its Outcome; the launch's RankResults)
- gpu_lease.py       host-wide GPU leases: launches running at once get disjoint GPUs
- system_metrics.py  CPU, memory and GPU use of the ranks while they run (GPU clocks and temperature too)
- stragglers.py      which rank held the others back, and why: the one line at the end of a launch
- ray_launcher.py    `@ray_launch`: a function that drives Ray itself (`from nbhelpers import ray_launch`)
- commands.py        `run_command`: a command line (torchrun, `axolotl train`) with its output in the cell

The engines import neither each other nor the decorators; errors.py, output.py and the other shared files import no
engine (tests/test_distributed.py checks the graph). Ray is optional (`pip install ".[ray]"`): only ray_engine.py and
ray_launcher.py use it, when a Ray launch runs (errors.import_ray, which says how to install Ray where it is missing);
`import nbhelpers` loads neither.
"""
