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
    kernel: str = "python3"  # the Jupyter kernel, i.e. the environment it runs in (Axolotl has its own)


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
        "notebooks/unsloth/ddp_llama_3_2_3b.ipynb",
        parameters={"output_dir": "{output_dir}", "num_gpus": None, "model_name": "{standin:llama-3.2-3b}",
                    "dataset_name": "json", "data_files": "{data}/finetome/train.jsonl", "max_seq_length": 512,
                    "gradient_accumulation_steps": 1, "max_steps": 20, "learning_rate": 0.01, "warmup_steps": 2,
                    "timing_warmup_steps": 2, "max_new_tokens": 8},
        expect={
            "world_size": ("==", 2),
            "final_loss_vs_initial": ("<", 0.97),
            "tokens_per_s": (">", 0),
            "trainable_parameters": (">", 0),
            "adapter_saved": ("==", True),
        },
        timeout=300,
        output_contains=("[rank 0]", "[rank 1]"),
    ),
    NotebookCase(
        "notebooks/axolotl/ddp_olmo3_7b.ipynb",
        parameters={"output_dir": "{output_dir}", "num_gpus": None, "base_model": "{standin:olmo-3-7b}",
                    "dataset_path": "{data}/alpaca_messages/train.jsonl", "sequence_len": 256,
                    "gradient_accumulation_steps": 1, "max_steps": 16, "learning_rate": 0.01,
                    "val_set_size": 0.02, "timing_warmup_steps": 2, "max_new_tokens": 8},
        expect={
            "world_size": ("==", 1),  # multi-process Axolotl needs GPUs: DDP is shown by the GPU run
            "final_loss_vs_initial": ("<", 0.95),
            "final_eval_loss": ("<", ("initial_loss", 0.97)),
            "tokens_per_s": (">", 0),
            "adapter_saved": ("==", True),
        },
        timeout=300,
        kernel="cookbook-axolotl",
        output_contains=("axolotl.cli.preprocess", "Training completed"),
    ),
]
