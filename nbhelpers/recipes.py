"""What the command-line recipes (recipes/*/train.py) share: config + flags, torchrun setup, a clear
error when a node is lost, alpaca-style prompts, shard facts, and the FLOP count behind MFU.

    cfg = parse_config("FSDP2 fine-tune")          # --config config.yaml, then any --key value override
    device = init_distributed(cfg["timeout_s"])    # the process group torchrun's environment describes
    with stop_clearly_if_a_peer_is_lost(cfg["timeout_s"]):
        train(...)                                 # a dead node: a one-paragraph error and exit 1, no hang
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import socket
import sys
from pathlib import Path

from nbhelpers import runtime

# Dense bf16 tensor-core peak per GPU, as the vendor's data sheet states it (no sparsity).
PEAK_BF16_FLOPS = {"H100": 989e12, "H200": 989e12, "H800": 989e12, "A100": 312e12, "A800": 312e12, "L40S": 362e12}

ALPACA_PROMPT_WITH_INPUT = (
    "Below is an instruction that describes a task, paired with an input that provides further context. "
    "Write a response that appropriately completes the request.\n\n"
    "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n")
ALPACA_PROMPT = (
    "Below is an instruction that describes a task. Write a response that appropriately completes the request.\n\n"
    "### Instruction:\n{instruction}\n\n### Response:\n")


# --------------------------------------------------------------------------------------------------
# Config: a YAML/JSON file whose every key is also a command-line flag
# --------------------------------------------------------------------------------------------------
def _parse_bool(text: str) -> bool:
    if text.lower() in ("1", "true", "yes", "on"):
        return True
    if text.lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, not {text!r}")


def _flag_type(default):
    if isinstance(default, bool):
        return _parse_bool
    if isinstance(default, (int, float, str)):
        return type(default)
    return lambda text: (None if text.lower() in ("null", "none")
                         else json.loads(text) if text[:1] in "[{" else _scalar(text))


def _scalar(text: str):
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def load_config_file(path: str | Path) -> dict:
    path = Path(path)
    if path.suffix == ".json":
        return json.loads(path.read_text())
    import yaml

    return yaml.safe_load(path.read_text()) or {}


def parse_config(description: str, argv=None) -> dict:
    """`--config FILE` (YAML or JSON), then `--key value` for any key of that file to override it."""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--config", required=True)
    known, _ = pre.parse_known_args(argv)
    defaults = load_config_file(known.config)
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--config", required=True, help="YAML/JSON file; each of its keys is also a flag")
    for key, value in defaults.items():
        parser.add_argument(f"--{key}", type=_flag_type(value), default=value, help=f"default: {value!r}")
    return vars(parser.parse_args(argv))


# --------------------------------------------------------------------------------------------------
# torchrun: process group, node facts, and a clear failure when another node goes away
# --------------------------------------------------------------------------------------------------
def init_distributed(timeout_s: float):
    """Join the process group torchrun describes; return this rank's device.

    `timeout_s` bounds every collective: if a node dies, the survivors fail after at most this long
    (gloo usually notices the closed connection at once; NCCL waits for the timeout).
    """
    import torch
    import torch.distributed as dist

    device = runtime.device()
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(runtime.backend(), timeout=datetime.timedelta(seconds=timeout_s),
                            device_id=device if device.type == "cuda" else None)
    return device


def shutdown() -> None:
    """Leave the process group; then spare the interpreter its final garbage collection over the ~10^6 objects
    that transformers, TRL and DeepSpeed create at import (seen taking minutes on a busy 2-core machine)."""
    import gc

    import torch.distributed as dist

    dist.destroy_process_group()
    gc.freeze()


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
def stop_clearly_if_a_peer_is_lost(timeout_s: float):
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
              f"(timeout {timeout_s:g} s). Another node probably died or became unreachable.\n"
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
def load_rows(dataset: str, split: str = "train"):
    """A hub dataset id (e.g. tatsu-lab/alpaca) or a local folder holding {split}.jsonl."""
    from datasets import load_dataset

    if Path(dataset).is_dir():
        return load_dataset("json", data_files={split: str(Path(dataset) / f"{split}.jsonl")}, split=split)
    return load_dataset(dataset, split=split)


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
# FLOPs and MFU
# --------------------------------------------------------------------------------------------------
FLOP_FORMULA = ("flops/token = 6 * N + 12 * L * H * S  (N: parameters used in matmuls = all parameters minus an "
                "untied input embedding; L layers; H = attention heads * head_dim; S sequence length; "
                "forward + backward, no recompute counted; attention counted as the full S x S, as PaLM does)")


def matmul_parameters(model) -> int:
    """Parameters that take part in a matmul: every parameter, minus the input embedding unless it is
    tied to the output layer (a lookup costs no FLOPs; the tied matrix is counted once, for the lm_head)."""
    total = sum(p.numel() for p in model.parameters())
    embedding = model.get_input_embeddings().weight
    output = model.get_output_embeddings()
    tied = output is not None and output.weight is embedding
    return total if tied else total - embedding.numel()


def flops_per_token(model, seq_len: int) -> float:
    config = model.config
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return 6 * matmul_parameters(model) + 12 * config.num_hidden_layers * heads * head_dim * seq_len


def peak_flops(device, override: float | None = None) -> float | None:
    """The bf16 dense peak of this GPU (FLOP/s), `override` if given, None on a CPU or an unknown GPU."""
    import torch

    if override:
        return float(override)
    if getattr(device, "type", "cpu") != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((flops for key, flops in PEAK_BF16_FLOPS.items() if key in name), None)
