"""Every notebook's smoke run, declared as data: notebook -> parameters -> expectations.

The runner (`harness.py`) executes each notebook with papermill and these parameters, then checks
`output_dir/metrics.json` against `expect`. Placeholders in string parameters are filled in:
  {output_dir}      a fresh folder for this run (every notebook has an `output_dir` parameter)
  {repo}            the repository root; {data} is {repo}/data
  {standin:NAME}    a tiny offline stand-in model folder (nbhelpers.standins), built once per session
Expectations: metric -> (op, bound), where bound is a number/bool/str, or (other_metric, factor)
meaning factor * metrics[other_metric]. Dotted metric names reach into nested dicts.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class NotebookCase:
    notebook: str  # path relative to the repository root
    parameters: dict = field(default_factory=dict)
    expect: dict = field(default_factory=dict)
    timeout: int = 300  # seconds, for each cell and for the whole run
    gpu_only: str | None = None  # why it cannot run on CPU; it is then skipped there with this reason
    output_contains: tuple = ()  # text the executed notebook's outputs must show (e.g. rank prefixes)


CASES = [
    NotebookCase(
        "notebooks/00_getting_started.ipynb",
        parameters={"output_dir": "{output_dir}", "num_gpus": None},
        expect={"world_size": ("==", 2), "ranks_returned": ("==", [0, 1]), "error_named_rank": ("==", 1)},
        timeout=120,
        output_contains=("[rank 0] hello from rank 0 of 2", "[rank 1] hello from rank 1 of 2"),
    ),
    NotebookCase(
        "notebooks/pytorch/ddp_mlp.ipynb",
        parameters={"output_dir": "{output_dir}", "epochs": 10, "num_samples": 8192,
                    "learning_rate": 0.003, "num_gpus": None},
        expect={
            "world_size": ("==", 2),
            "final_loss": ("<", 0.1),
            "final_loss_vs_initial": ("<", 0.3),
            "params_identical_across_ranks": ("==", True),
        },
        timeout=180,
        output_contains=("[rank 0]",),
    ),
    NotebookCase(
        "notebooks/lightning/ddp_two_tower.ipynb",
        parameters={"output_dir": "{output_dir}", "ratings_path": "{data}/ratings/item_ratings.csv",
                    "epochs": 6, "batch_size": 256, "num_workers": 0, "num_gpus": None},
        expect={
            "world_size": ("==", 2),
            "lightning_world_size": ("==", 2),
            "process_group_backend": ("==", "gloo"),
            "lightning_cluster_environment": ("==", "TorchElasticEnvironment"),  # saw @distributed's launch
            "lightning_started_processes": ("==", 0),  # and did not relaunch
            "test_auroc": (">=", 0.7),
            "test_auroc_same_on_all_ranks": ("==", True),
            "final_loss": ("<", ("initial_loss", 0.5)),
            "best_checkpoint_written_by_ranks": ("==", [0]),
            "checkpoint_writer_ranks": ("==", [0]),  # rank 1 wrote no checkpoint file at all
            "best_checkpoint_stamp_rank": ("==", 0),
            "checkpoint_files_unaccounted": ("==", []),
        },
        timeout=240,
        output_contains=("[rank 0]", "started 0 processes of its own"),
    ),
]
