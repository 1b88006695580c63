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
        "notebooks/choose_your_technique.ipynb",
        parameters={"output_dir": "{output_dir}"},
        # planner facts (keys: model names with '.' -> '_'): what fits where, and the pick per setup
        expect={
            "num_plans": ("==", 9 * 3 * 2 * 2),
            "fits.full.1x80GB.llama-3_2-1b.ddp": ("==", True),
            "recommended.full.1x80GB.llama-3_2-1b": ("==", "ddp"),
            "recommended.full.2x80GB.llama-3_2-3b": ("==", "zero2"),
            "recommended.full.8x80GB.llama-3_1-8b": ("==", "zero2"),
            "recommended.full.2x80GB.qwen3-8b": ("==", "none"),
            "recommended.full.8x80GB.gpt-oss-20b": ("==", "fsdp"),
            "fits.full.1x141GB.gpt-oss-120b.ddp": ("==", False),
            "recommended.full.1x141GB.gpt-oss-120b": ("==", "none"),
            "recommended.full.8x141GB.gpt-oss-120b": ("==", "none"),
            "recommended.lora.8x141GB.gpt-oss-120b": ("==", "fsdp"),
            "recommended.lora.1x80GB.llama-3_1-8b": ("==", "ddp"),
            "parameters.gpt-oss-120b": (">", 1.16e11),
        },
        timeout=240,
    ),
]
