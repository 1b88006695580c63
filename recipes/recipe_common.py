"""What the command-line recipes (recipes/*/train.py) share, and nothing else does: settings from config.yaml and
flags (Hugging Face's parser), torchrun setup, a clear error when a node is lost, alpaca-style data, the FLOP count
behind MFU, and MLflow tracking.

Each train.py puts this folder (recipes/) on sys.path, so `torchrun ... train.py` and `python train.py`
work from anywhere; the Ray recipes ship this file to every node with `runtime_env={"py_modules": ...}`.

    args = parse_settings(Settings, Path(__file__).parent, "FSDP2 fine-tune")  # config.yaml's keys are the flags
    with torchrun_job("fsdp2", args) as (device, tracking):   # process group, seed, MLflow run on rank 0
        ...                                        # a dead node: a clear error and exit 1, no hang
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import difflib
import json
import os
import socket
import sys
from pathlib import Path
from typing import NamedTuple, get_args, get_type_hints

from nbhelpers.planner.flops import flops_per_token, matmul_parameters
from nbhelpers.training import checkpoints, runtime
from nbhelpers.training.tracking import mlflow_experiment, mlflow_tracking_uri


ALPACA_PROMPT_WITH_INPUT = (
    "Below is an instruction that describes a task, paired with an input that provides further context. "
    "Write a response that appropriately completes the request.\n\n"
    "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n")
ALPACA_PROMPT = (
    "Below is an instruction that describes a task. Write a response that appropriately completes the request.\n\n"
    "### Instruction:\n{instruction}\n\n### Response:\n")


# --------------------------------------------------------------------------------------------------
# Settings: a dataclass of the recipe's keys, read by Hugging Face's HfArgumentParser; config.yaml holds their values
# --------------------------------------------------------------------------------------------------
def parse_settings(settings: type, recipe_dir: str | Path, description: str, argv=None):
    """The recipe's settings, an instance of the dataclass `settings` (names and types; a field with
    help=argparse.SUPPRESS is a test hook, hidden from --help): RECIPE_DIR/config.yaml's values, then `--config FILE`
    (YAML/JSON, any subset of its keys), then `--key value` flags (`--bf16` alone means true)."""
    from transformers import HfArgumentParser

    argv = list(sys.argv[1:] if argv is None else argv)
    hooks = [f.name for f in dataclasses.fields(settings) if f.metadata.get("help") == argparse.SUPPRESS]
    public = [f.name for f in dataclasses.fields(settings) if f.name not in hooks]
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--config")
    given = pre.parse_known_args(argv)[0].config
    values = {}
    for path in [Path(recipe_dir) / "config.yaml", *([given] if given else [])]:
        layer = load_config_file(path)
        refuse_unknown_settings(path, layer, known=public, hidden=hooks)
        values.update(layer)
    parser = HfArgumentParser(settings, description=description, formatter_class=argparse.RawDescriptionHelpFormatter,
                              epilog=f"What each setting means: {Path(recipe_dir) / 'config.yaml'}")
    parser.add_argument("--config", help="YAML/JSON file of any of these settings, applied before the flags")
    optional = [name for name, kind in get_type_hints(settings).items() if type(None) in get_args(kind)]
    for action in parser._actions:  # the files' values are the defaults, so no flag is required (as TrlParser does)
        if action.dest in values:
            action.default, action.required = values[action.dest], False
            action.help = action.help or f"default: {values[action.dest]!r}"
        if action.dest in optional:  # `--key null` is None, as in YAML (not the text "null")
            action.type = _null_or(action.type)
    parsed, _, unrecognized = parser.parse_args_into_dataclasses(argv, return_remaining_strings=True,
                                                                 look_for_args_file=False)
    if unrecognized:
        parser.error(f"unrecognized arguments: {' '.join(unrecognized)}")
    return parsed


def _null_or(kind):
    def parse(text: str):
        return None if text.lower() in ("null", "none") else kind(text)

    parse.__name__ = kind.__name__  # argparse's "invalid int value"
    return parse


def refuse_unknown_settings(path: str | Path, keys, known, hidden=()) -> None:
    """Stop with one line if the file PATH holds a key that is no setting (`known`, or a test hook in `hidden`),
    naming the nearest setting and all of them."""
    unknown = sorted(set(keys) - set(known) - set(hidden))
    if unknown:
        near = sorted({match for key in unknown for match in difflib.get_close_matches(key, known, n=1)})
        hint = f" (did you mean {', '.join(near)}?)" if near else ""
        raise SystemExit(f"{path}: unknown setting(s) {unknown}{hint}; the settings are {sorted(known)}")


def load_config_file(path: str | Path) -> dict:
    path = Path(path)
    if path.suffix == ".json":
        return json.loads(path.read_text())
    import yaml

    return yaml.safe_load(path.read_text()) or {}


def config_with_overrides(config: str | Path, overrides: str | Path | None = None) -> Path:
    """A YAML file (in a temporary folder) of `config`'s settings with `overrides`' keys applied: for a parser whose
    --config replaces the recipe's file (TRL's), as a workload's `parameters` (HYPERPARAMETERS_PATH) change only a few.
    A key `config` does not have is refused, naming the known ones. Activation checkpointing's TrainingArguments
    fields go under the names the installed Transformers reads (nbhelpers.training.activation_checkpointing),
    whichever of its two names either file gives them."""
    import tempfile

    import yaml

    from nbhelpers.training.activation_checkpointing import with_installed_names

    settings = with_installed_names(load_config_file(config))
    changes = with_installed_names(load_config_file(overrides)) if overrides else {}
    refuse_unknown_settings(overrides, changes, known=settings)
    merged = Path(tempfile.mkdtemp(prefix="recipe-config-")) / Path(config).name
    merged.write_text(yaml.safe_dump({**settings, **changes}, sort_keys=False))
    return merged


# --------------------------------------------------------------------------------------------------
# torchrun: process group, node facts, and a clear failure when another node goes away
# --------------------------------------------------------------------------------------------------
def init_distributed(ddp_timeout: float):
    """Join the process group torchrun describes (unless the framework already did, as TRL's parser does through
    accelerate); return this rank's device.

    `ddp_timeout` (seconds) bounds every collective: if a node dies, the survivors fail after at most this long
    (gloo usually notices the closed connection at once; NCCL waits for the timeout).
    """
    import torch
    import torch.distributed as dist

    device = runtime.device()
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        dist.init_process_group(runtime.backend(), timeout=datetime.timedelta(seconds=ddp_timeout),
                                device_id=device if device.type == "cuda" else None)
    return device


@contextlib.contextmanager
def torchrun_job(recipe: str, args):
    """Everything a torchrun recipe does around its training, in order: join the process group, seed, stop clearly
    if a node is lost, track the run in MLflow (rank 0); yields (this rank's device, mlflow or None); at the end leaves
    the process group and ends the process (`shutdown`)."""
    import torch

    device = init_distributed(args.ddp_timeout)
    torch.manual_seed(args.seed)
    with (stop_clearly_if_a_peer_is_lost(args.ddp_timeout),
          mlflow_run(recipe, args.output_dir, args.mlflow_tracking_uri, vars(args)) as tracking):
        yield device, tracking
    shutdown()


def shutdown() -> None:
    """Leave the process group, then end the process (exit code 0) without the interpreter's finalization.

    destroy_process_group leaves gloo's threads running while anything still refers to a group (FSDP2's state does).
    Such a thread that frees the last reference to a tensor takes the GIL; if it gets it while the interpreter
    finalizes, Python (before 3.14) ends the thread inside a C++ destructor, and the rank aborts after training to the
    end ("terminate called without an active exception"). Finalization would also garbage-collect the ~10^6 objects
    that transformers, TRL and DeepSpeed create at import (seen taking minutes on a busy 2-core machine).
    """
    import torch.distributed as dist

    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def node_rank() -> int:
    """The node (torchrun agent) of this rank: GROUP_RANK, assigned by the rendezvous."""
    return int(os.environ.get("GROUP_RANK", os.environ.get("NODE_RANK", 0)))


def where() -> str:
    return f"rank {runtime.get_rank()} (node {node_rank()}, host {socket.gethostname()})"


# What gloo, NCCL and the TCPStore say when the other side of a collective is gone or silent.
_LOST_PEER_SIGNS = ("connection closed by peer", "connection reset by peer", "broken pipe", "timed out", "timeout",
                    "watchdog", "gloo", "tcpstore", "connection refused")


def is_lost_peer_error(error: BaseException) -> bool:
    import torch.distributed as dist

    if isinstance(error, dist.DistError):
        return True
    text = str(error).lower()
    return isinstance(error, (RuntimeError, OSError)) and any(sign in text for sign in _LOST_PEER_SIGNS)


@contextlib.contextmanager
def stop_clearly_if_a_peer_is_lost(ddp_timeout: float):
    """Turn a failed collective (a node died, the network broke) into one clear message and exit 1.

    Exits with os._exit: after a lost peer, process-group teardown and atexit handlers may block on the
    dead rank, and a recipe must fail, not hang.
    """
    try:
        yield
    except Exception as error:  # noqa: BLE001 - re-raised below unless it is a communication failure
        if not is_lost_peer_error(error):
            raise
        text = f"{type(error).__name__}: {error}"
        print(f"\nLOST PEER: {where()} stopped: a collective with the other ranks failed or timed out "
              f"(ddp_timeout {ddp_timeout:g} s). Another node probably died or became unreachable.\n"
              f"  cause: {text.strip()[:800]}\n"
              "  What to do: check the other nodes' logs, then start the same command on every node again; "
              "training resumes from the last checkpoint if the recipe saves them.", file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(1)


def gather_rank_facts(**facts) -> list[dict]:
    """Every rank's facts (rank, node, host, plus `facts`), in rank order, on every rank."""
    import torch.distributed as dist

    mine = {"rank": runtime.get_rank(), "node_rank": node_rank(), "host": socket.gethostname(), **facts}
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    return everyone


# --------------------------------------------------------------------------------------------------
# Data: alpaca-style rows -> (input_ids, labels) with the loss on the response only
# --------------------------------------------------------------------------------------------------
def load_rows(dataset_name: str, split: str = "train"):
    """A hub dataset id (e.g. tatsu-lab/alpaca), a local folder holding {split}.jsonl, or one JSON/JSONL file."""
    from datasets import load_dataset

    path = Path(dataset_name).expanduser()
    if path.is_dir():
        return load_dataset("json", data_files={split: str(path / f"{split}.jsonl")}, split=split)
    if path.is_file():
        return load_dataset("json", data_files={split: str(path)}, split=split)
    return load_dataset(dataset_name, split=split)


def alpaca_prompt(row: dict) -> str:
    if row.get("input"):
        return ALPACA_PROMPT_WITH_INPUT.format(instruction=row["instruction"], input=row["input"])
    return ALPACA_PROMPT.format(instruction=row["instruction"])


def tokenize_prompt_response(tokenizer, prompt: str, response: str, max_length: int) -> tuple[list, list]:
    """(input_ids, labels), already shifted: labels[i] is the token after input_ids[i], -100 inside the prompt.

    The sequence is prompt + response + eos, cut to max_length + 1 tokens (max_length inputs).
    """
    prompt_ids = tokenizer(prompt, add_special_tokens=True)["input_ids"]
    response_ids = tokenizer(response, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    ids = (prompt_ids + response_ids)[: max_length + 1]
    labels = [-100 if i + 1 < len(prompt_ids) else ids[i + 1] for i in range(len(ids) - 1)]
    return ids[:-1], labels


# --------------------------------------------------------------------------------------------------
# FLOPs and MFU (the formula itself is nbhelpers.planner.flops: the performance notebook uses it too)
# --------------------------------------------------------------------------------------------------
def model_sizes(model, seq_len: int) -> dict:
    """Parameters, matmul parameters and FLOPs per token at `seq_len` (count them before sharding)."""
    return {"parameters": sum(p.numel() for p in model.parameters()), "matmul_parameters": matmul_parameters(model),
            "flops_per_token": flops_per_token(model, seq_len)}



# --------------------------------------------------------------------------------------------------
# Distributed checkpoints of a sharded model (FSDP or FSDP2): every rank writes its own shards, resumable on any
# number of ranks; sealed and verified by nbhelpers.training.checkpoints
# --------------------------------------------------------------------------------------------------
class Resumed(NamedTuple):
    path: Path | None = None  # the checkpoint; None: a fresh start
    step: int = 0
    losses: list = []


def save_checkpoint(model, optimizer, step: int, losses: list, checkpoint_dir: Path, keep: int) -> Path:
    """step_N, written as nbhelpers.training.checkpoints does: into step_N.tmp, manifest last, renamed into place."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    path = checkpoint_dir / f"step_{step:07d}"
    model_state, optimizer_state = get_state_dict(model, optimizer)
    with checkpoints.saving(path, {"step": step, "losses": losses}, keep=keep) as folder:
        dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=folder)
    return path


def resume(model, optimizer, checkpoint_dir: Path) -> Resumed:
    """Load the newest checkpoint whose every shard verifies, if there is one (the ranks check it together)."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    path = checkpoints.newest_verified(checkpoint_dir, "step_*")
    if path is None:
        return Resumed()
    model_state, optimizer_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optimizer": optimizer_state}
    dcp.load(state, checkpoint_id=path)
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
    metadata = checkpoints.read_metadata(path)
    if dist.get_rank() == 0:
        print(f"resumed from {path} (step {metadata['step']})", flush=True)
    return Resumed(path, metadata["step"], metadata["losses"])


def newest_ray_checkpoint(experiment_dir: str | Path) -> tuple[Path | None, dict | None]:
    """Ray Train: the newest training checkpoint of this run (Ray's folder of it, under storage_path) whose files
    match their manifest, and its `checkpoint.pt` loaded; (None, None) on a fresh start. Read from the storage
    itself, not from ray.train.get_checkpoint(): a worker that dies right after a report can leave Ray's record of
    the newest checkpoint behind what was uploaded. A final model reported beside them is no training state.
    Every worker calls this (they check it together)."""
    import torch

    folder = checkpoints.newest_verified(Path(experiment_dir), "checkpoint_*",
                                         where=lambda metadata: not metadata.get("final_model"))
    if folder is None:
        return None, None
    return folder, torch.load(folder / "checkpoint.pt", map_location="cpu", weights_only=True)


def checkpoint_dir_to_use(args) -> Path:
    """output_dir/checkpoints. A run that would start afresh over an earlier run is refused here, before anything
    loads or is overwritten: over its checkpoints (resume_from_checkpoint false), or, with no checkpoint to resume
    from (save_steps 0 writes none), over its final_model/ or metrics.json."""
    output_dir = Path(args.output_dir)
    folder = output_dir / "checkpoints"
    if not args.resume_from_checkpoint:
        checkpoints.refuse_to_start_over(folder, "step_*")
    if not args.resume_from_checkpoint or not _has_checkpoints(folder):
        earlier = [name for name in ("final_model", "metrics.json") if (output_dir / name).exists()]
        if earlier:
            raise FileExistsError(f"{output_dir} holds the {' and '.join(earlier)} of an earlier run, and this run "
                                  f"would start afresh (no checkpoint in {folder} to resume from) and replace them: "
                                  "pass another output_dir, or delete them")
    return folder


def _has_checkpoints(folder: Path) -> bool:
    # step_N.tmp, step_N.old: a save in progress, a checkpoint being replaced (nbhelpers.training.checkpoints), no resume point
    return any(p.is_dir() and not p.name.endswith((".tmp", ".old")) for p in folder.glob("step_*"))


# --------------------------------------------------------------------------------------------------
# MLflow: one tracking store per project (the runs folder), rank 0 only
# --------------------------------------------------------------------------------------------------
@contextlib.contextmanager
def mlflow_run(experiment: str, output_dir: str | Path, tracking_uri: str | None, params: dict):
    """On rank 0, an MLflow run named after OUTPUT_DIR in `experiment`, with `params` logged; yields the `mlflow`
    module there and None on the other ranks. A local store keeps its artifacts beside it (runs/mlartifacts).
    Where MLFLOW_RUN_ID is set (Databricks' AI Runtime sets it for an `air run` workload: workload.yaml),
    the recipe logs into that run itself, in its own experiment and store (MLFLOW_TRACKING_URI)."""
    if runtime.get_rank() != 0:
        yield None
        return
    import mlflow

    # Taken out of the environment while the run is active (as mlflow.start_run() does when it reads it itself):
    # transformers' MLflowCallback (TRL's report_to: mlflow) starts a run of MLFLOW_RUN_ID when it is set, which fails
    # with "Run ... is already active"; without it, the callback logs into the active run.
    platform_run = os.environ.pop("MLFLOW_RUN_ID", None)
    try:
        if platform_run:
            mlflow.set_tracking_uri(mlflow_tracking_uri(output_dir, tracking_uri))
            run = mlflow.start_run(run_id=platform_run, log_system_metrics=True)
        else:
            mlflow_experiment(experiment, mlflow_tracking_uri(output_dir, tracking_uri))
            run = mlflow.start_run(run_name=Path(output_dir).name, log_system_metrics=True)
        with run:
            mlflow.log_params(params)
            yield mlflow
    finally:
        if platform_run:
            os.environ["MLFLOW_RUN_ID"] = platform_run


def log_causal_lm(tracking, model_dir: str | Path) -> None:
    """Log a saved causal LM (config, weights, tokenizer) as an MLflow transformers model for text generation
    (signature: text in, text out), from its folder: the model is not loaded again. `tracking`: what `mlflow_run`
    yielded; None does nothing."""
    if tracking is not None:
        with _pipeline_class_in_task_registry("text-generation"):
            tracking.transformers.log_model(transformers_model=str(model_dir), task="text-generation", name="model")


@contextlib.contextmanager
def _pipeline_class_in_task_registry(task: str):
    """MLflow (3.18, which declares Transformers up to 5.20.2) logs a model folder by reading the `__name__` of the
    task's pipeline class in Transformers' task registry (transformers.pipelines.SUPPORTED_TASKS); from Transformers
    5.23 the registry holds the class's dotted path, imported when a pipeline is made, and MLflow fails with "'str'
    object has no attribute '__name__'". For that one call the task's entry holds the class, as up to 5.22; then it
    holds what it held. Where it holds a class (Transformers 5.17, the GPU machine's) nothing changes."""
    import importlib

    from transformers.pipelines import SUPPORTED_TASKS

    entry = SUPPORTED_TASKS[task]
    impl = entry["impl"]
    if isinstance(impl, str):
        module, _, name = impl.rpartition(".")
        entry["impl"] = getattr(importlib.import_module(module), name)
    try:
        yield
    finally:
        entry["impl"] = impl
