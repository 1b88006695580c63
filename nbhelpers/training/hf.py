"""What the Hugging Face notebooks share: throughput without the warm-up steps, one clear error for a model or
dataset that cannot be found or a loss that cannot run without a GPU, one MLflow run that the notebook and the Trainer's callback both log into, the
adapter's fingerprint (DDP keeps it identical on every rank) and the merged model's export."""
from __future__ import annotations

import os
import time
from pathlib import Path

import torch
from transformers import TrainerCallback


class StepTimer(TrainerCallback):
    """Clock and input-token count (summed over all ranks) at the end of every optimizer step.

    The Trainer's own `train_tokens_per_second` includes the first steps (allocator growth, first
    all-gathers, kernel autotuning); `tokens_per_second(warmup_steps)` leaves them out, which is what a
    benchmark compares. Needs `include_num_input_tokens_seen` ("all" or "non_padding") in the arguments.
    """

    def __init__(self):
        self.times, self.tokens = [], []

    def on_step_end(self, args, state, control, **kwargs):
        if torch.cuda.is_available():
            torch.cuda.synchronize()  # the step's kernels are done, not just queued
        self.times.append(time.perf_counter())
        self.tokens.append(state.num_input_tokens_seen)

    def first_timed(self, warmup_steps: int) -> int:
        """Index of the step the timing starts from: after the warm-up, keeping at least one timed step."""
        if len(self.times) < 2:
            raise RuntimeError("tokens/s needs at least 2 optimizer steps")
        return min(warmup_steps, len(self.times) - 2)

    def timed_steps(self, warmup_steps: int) -> int:
        return len(self.times) - 1 - self.first_timed(warmup_steps)

    def tokens_per_second(self, warmup_steps: int) -> float:
        first = self.first_timed(warmup_steps)
        if self.tokens[-1] == 0:
            raise RuntimeError("no tokens counted: pass include_num_input_tokens_seen='non_padding' to the config")
        return (self.tokens[-1] - self.tokens[first]) / (self.times[-1] - self.times[first])


def logged(trainer, key: str = "loss") -> list[float]:
    """The values of one logged metric (loss, eval_loss, ...) in the order the Trainer logged them."""
    return [entry[key] for entry in trainer.state.log_history if key in entry]


def adapter_fingerprint(model) -> str:
    """A hash of this rank's trainable (LoRA) weights: DDP keeps them identical on every rank."""
    import hashlib

    digest = hashlib.sha256()
    for parameter in model.parameters():
        if parameter.requires_grad:
            digest.update(parameter.detach().float().cpu().numpy().tobytes())
    return digest.hexdigest()


def save_merged(model, tokenizer, folder) -> None:
    """Merge a PEFT model's adapter into its base weights and save the result to `folder` (safetensors shards).

    Saved from its state dict: transformers 5.17's `save_pretrained` writes the experts of a GPT-OSS model loaded
    with `Mxfp4Config(dequantize=True)` under broken names (it reverses the MXFP4 loading step)."""
    from huggingface_hub import save_torch_state_dict

    merged = model.merge_and_unload()
    for part in (merged.config, merged.generation_config, tokenizer):
        part.save_pretrained(folder)
    save_torch_state_dict(merged.state_dict(), folder, max_shard_size="5GB")


GATED_ADVICE = ("If it is a gated model (meta-llama/..., for one), accept its licence on its page at "
                "https://huggingface.co/{name} and pass a token: `export HF_TOKEN=hf_...` before starting Jupyter "
                "(or papermill), or run `hf auth login` once.")


class NotFoundError(FileNotFoundError):
    """A model or dataset that is neither a local folder nor reachable on the Hugging Face hub."""


def find_model(model_name_or_path: str):
    """The model's config (AutoConfig), or one NotFoundError naming it, where it was looked for, and what to do.

    A local folder is used if it exists; a name that can only be a path (absolute, ./, ~/, several /) must exist;
    anything else is a hub id (fetched unless HF_HUB_OFFLINE=1, then looked up in the local cache).
    """
    from transformers import AutoConfig

    local = _local_path(model_name_or_path)
    if local is not None:
        if not (local / "config.json").is_file():
            raise NotFoundError(f"model {model_name_or_path!r}: {_missing(local, 'config.json')} (looked for on "
                                "disk only: a path is never looked up on the hub)")
        return AutoConfig.from_pretrained(local)
    try:
        return AutoConfig.from_pretrained(model_name_or_path)
    except OSError as error:
        raise NotFoundError(f"model {model_name_or_path!r} is not a folder on disk (none at "
                            f"{Path(model_name_or_path).resolve()}) and {_hub_failure(error)}. "
                            + GATED_ADVICE.format(name=model_name_or_path)) from None


def find_dataset(dataset_name: str) -> str:
    """`dataset_name` unchanged if it is an existing local path or may be a hub id; a path that cannot be found is a
    NotFoundError naming it (instead of a hub lookup of a path, or an error from inside the ranks)."""
    local = _local_path(dataset_name)
    if local is not None and not local.exists():
        raise NotFoundError(f"dataset {dataset_name!r}: {_missing(local, 'data files')} (a path is looked for on "
                            "disk only)")
    return dataset_name


def check_push_to_hub(push_to_hub: bool, hub_model_id: str) -> None:
    """Before any training: pushing needs a repository name and a token (HF_TOKEN, or `hf auth login`)."""
    if not push_to_hub:
        return
    from huggingface_hub import get_token

    if not hub_model_id or get_token() is None:
        raise ValueError("push_to_hub needs hub_model_id (e.g. 'your-name/gpt-oss-20b-multilingual') and a token with "
                         "write access: `export HF_TOKEN=hf_...` or run `hf auth login` once"
                         f" (hub_model_id={hub_model_id!r}, token {'found' if get_token() else 'not found'})")


class NeedsGpuError(RuntimeError):
    """What the notebook trains with cannot run on this machine's CPUs."""


def check_trl_loss_runs_here() -> None:
    """Before anything loads: TRL 1.15's SFTTrainer computes its loss with a Triton kernel (`trl.kernels`), which needs
    a GPU. Without one, one line says so here, instead of Triton's "0 active drivers" at the first training step.
    With a GPU nothing is run (the notebook's own process keeps off the GPU)."""
    if torch.cuda.is_available():
        return
    from trl.trainer import utils

    try:
        utils._ChunkedLogProbFunction.apply(torch.zeros(1, 8), torch.zeros(4, 8), None, torch.zeros(1, dtype=torch.long),
                                            1.0, 4)
    except RuntimeError as error:
        if "active drivers" not in str(error):
            raise
        raise NeedsGpuError("no GPU is visible, and TRL's SFTTrainer computes its loss with a Triton kernel that needs "
                            "one (TRL 1.15): run this notebook on a machine with an NVIDIA GPU; on CPUs, the PyTorch "
                            "notebooks (notebooks/pytorch/) run as 2 processes") from None


def start_mlflow_run(args, experiment: str) -> str:
    """Start this notebook run's MLflow run, log the notebook's settings (as `notebook.<name>`), return its id.

    The store: nbhelpers.training.metrics.mlflow_tracking_uri (MLFLOW_TRACKING_URI, else the project's store beside
    args.output_dir). The Trainer's MLflow callback (`report_to=["mlflow"]`, rank 0) logs its settings and metrics into the same
    run: it reads MLFLOW_RUN_ID, set here and inherited by the ranks, and with MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING
    MLflow samples CPU, memory and (where nvidia-ml-py is installed) GPU use while it trains.
    """
    import mlflow

    from nbhelpers.training.metrics import mlflow_experiment, mlflow_tracking_uri

    os.environ.pop("MLFLOW_RUN_ID", None)  # a second run of the notebook in this kernel starts a new MLflow run
    tracking_uri = mlflow_tracking_uri(args.output_dir)
    mlflow_experiment(experiment, tracking_uri)
    with mlflow.start_run(run_name=Path(args.output_dir).name) as run:
        mlflow.log_params({f"notebook.{name}": value for name, value in vars(args).items()})
    os.environ.update(MLFLOW_TRACKING_URI=tracking_uri, MLFLOW_RUN_ID=run.info.run_id,
                      MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING="true")
    return run.info.run_id


def _local_path(name: str) -> Path | None:
    """The path `name` names on disk: an existing one, or one that cannot be a hub id; None for a (possible) hub id."""
    path = Path(name).expanduser()
    if path.exists() or path.is_absolute() or name.startswith((".", "~")) or name.count("/") > 1:
        return path
    return None


def _missing(path: Path, what: str) -> str:
    path = path.resolve()
    if not path.exists():
        return f"no such file or folder: {path}"
    return f"{path} holds no {what}"


def _hub_failure(error: OSError) -> str:
    from huggingface_hub import constants
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    cause = error.__cause__ or error
    if isinstance(cause, GatedRepoError):
        return "it is gated on the hub and this token has no access to it"
    if isinstance(cause, RepositoryNotFoundError):
        return "the hub has no such repository (or it is private or gated, and no token was given)"
    if constants.HF_HUB_OFFLINE:
        return "it is not in the local hub cache, and HF_HUB_OFFLINE=1 forbids fetching it from the hub"
    return f"it could not be fetched from the hub ({str(error).splitlines()[0]})"
