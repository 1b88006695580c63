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
    # TRL notebooks: tiny random-weight stand-ins of the real architectures, a slice of the data, few steps.
    # LoRA on a frozen random base barely moves the loss (the random LM head caps the logits), so the
    # LoRA cases also check the token accuracy, which the adapters lift from ~0 within a few steps.
    NotebookCase(
        "notebooks/trl/ddp_gpt_oss_20b.ipynb",
        parameters={"output_dir": "{output_dir}", "num_gpus": None, "model_name": "{standin:gpt-oss-20b}",
                    "dataset_name": "{data}/multilingual_thinking", "dataset_split": "train[:160]", "max_length": 256,
                    "per_device_train_batch_size": 4, "gradient_accumulation_steps": 1, "max_steps": 20,
                    "learning_rate": 0.02, "lora_experts": True, "logging_steps": 5, "max_new_tokens": 16,
                    "temperature": 0.0},
        expect={
            "world_size": ("==", 2),
            "trainer_world_size": ("==", 2),
            "wrapped_model": ("==", "DistributedDataParallel"),
            "final_loss_vs_initial": ("<", 0.98),
            "final_token_accuracy": (">", 0.1),
            "adapter_saved": ("==", True),
        },
        timeout=240,
        output_contains=("[rank 0]", "[rank 1]"),
    ),
    NotebookCase(
        "notebooks/trl/fsdp_gpt_oss_120b.ipynb",
        parameters={"output_dir": "{output_dir}", "num_gpus": None, "model_name": "{standin:gpt-oss-120b}",
                    "dataset_name": "{data}/multilingual_thinking", "dataset_split": "train[:160]", "max_length": 256,
                    "per_device_train_batch_size": 4, "gradient_accumulation_steps": 1, "max_steps": 20,
                    "learning_rate": 0.01, "logging_steps": 5},
        expect={
            "world_size": ("==", 2),
            "trainer_world_size": ("==", 2),
            "fsdp_enabled": ("==", True),
            "decoder_layers_sharded": ("==", True),
            "dtensor_fraction": ("==", 1.0),
            "parameters_held_fraction_max": ("<", 0.55),
            "lora_rank_attention": ("==", [32]),
            "lora_rank_experts": ("==", [8]),
            "final_loss_vs_initial": ("<", 0.99),
            "final_token_accuracy": (">", 0.05),
            "adapter_matches_peft": ("==", True),
            "adapter_lora_b_trained": ("==", True),
        },
        timeout=240,
    ),
    NotebookCase(
        "notebooks/trl/deepspeed_llama_3_2_1b.ipynb",
        parameters={"output_dir": "{output_dir}", "num_gpus": None, "model_name": "{standin:llama-3.2-1b}",
                    "dataset_name": "{data}/capybara", "train_split": "train[:160]", "eval_split": "test[:32]",
                    "max_length": 128, "per_device_train_batch_size": 8, "gradient_accumulation_steps": 1,
                    "max_steps": 20, "learning_rate": 0.003, "eval_steps": 20, "logging_steps": 2,
                    "max_new_tokens": 16},
        expect={
            "world_size": ("==", 2),
            "trainer_world_size": ("==", 2),
            "engine": ("==", "DeepSpeedEngine"),
            "parameters_held_fraction_max": ("<", 0.55),
            "best_eval_loss_vs_initial": ("<", 0.8),
            "final_loss_vs_initial": ("<", 0.8),
            "final_model_saved": ("==", True),
        },
        timeout=240,
    ),
]
