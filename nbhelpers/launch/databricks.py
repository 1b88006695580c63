"""Databricks' spellings of the launcher's settings, as this launcher reads them: code written for Databricks runs
with only the import changed.

- Two decorators name the same settings two ways: serverless_gpu's `gpus`, `gpu_type` and the AI Runtime SDK's
  (databricks.air) `num_accelerators`, `accelerator_type`; either is taken, both if they agree (`one_of`);
  databricks.air's positional form `distributed(8, ...)` too (`positional_num_accelerators`).
- databricks.air's `accelerator_type` is a node shape, "GPU_8xH100" (`accelerator_shape`: 8 GPUs, "H100");
  `gpu_type_name` gives either spelling as the words of a GPU's product name.
- `.with_overrides(...)`: the decorator's settings with some changed (`overridden`), as databricks.air's.
- Its `timeout` default (DEFAULT_TIMEOUT_S), and its GPU-pool variables, which mean nothing here
  (`say_what_pools_mean_here`).

Where those checks meet this machine's GPUs: nbhelpers.launch.gpus. Nothing here imports an engine, the decorator
(nbhelpers.launch.launcher) or torch.
"""
from __future__ import annotations

import os
import re
import sys

DEFAULT_TIMEOUT_S = 10800  # databricks.air's: 3 hours
ACCELERATOR_TYPES = ("GPU_1xA10", "GPU_1xH100", "GPU_8xH100", "GPU_8xB300")  # databricks.air 0.1.1's
POOL_VARIABLES = ("DATABRICKS_USE_RESERVED_GPU_POOL", "DATABRICKS_REMOTE_GPU_POOL_ID")
UNSET = object()  # with_overrides: an argument not given
_NONE_KEEPS = ("num_accelerators", "accelerator_type", "remote", "gpus", "gpu_type")  # as databricks.air's with_overrides
_SYNONYMS = {"gpus": "num_accelerators", "num_accelerators": "gpus", "gpu_type": "accelerator_type",
             "accelerator_type": "gpu_type"}


def positional_num_accelerators(fn, num_accelerators):
    """databricks.air's `distributed(num_accelerators, accelerator_type, remote, timeout)`: a first argument that is
    not a function is num_accelerators. (fn, num_accelerators) as meant."""
    if fn is None or callable(fn):
        return fn, num_accelerators
    if num_accelerators is not None:
        raise TypeError(f"distributed() got num_accelerators twice: {fn!r} (first, positional) and {num_accelerators!r}")
    return None, fn


def one_of(name, value, synonym, synonym_value):
    """serverless_gpu's name or databricks.air's for the same setting: either one, or both if they agree."""
    if synonym_value is None:
        return value
    if value is not None and value != synonym_value:
        raise ValueError(f"{name}={value!r} and {synonym}={synonym_value!r} name the same setting "
                         f"(serverless_gpu's and databricks.air's spelling) with different values: pass one of them")
    return synonym_value


def accelerator_shape(accelerator_type) -> tuple[int, str]:
    """databricks.air's accelerator_type as its node shape: "GPU_8xH100" -> (8, "H100"), GPUs per node and their kind.
    A value not of the form GPU_<count>x<GPU> is refused, naming the documented ones."""
    text = str(getattr(accelerator_type, "value", accelerator_type))
    match = re.fullmatch(r"GPU_([1-9][0-9]*)x([A-Za-z0-9]+)", text.strip(), flags=re.IGNORECASE)
    if match is None:
        raise ValueError(f"accelerator_type={accelerator_type!r} is not a node shape GPU_<count>x<GPU>: Databricks "
                         f"names {', '.join(ACCELERATOR_TYPES)}. (serverless_gpu's spelling of the GPU alone, "
                         "gpu_type='H100', is gpu_type.)")
    return int(match.group(1)), match.group(2)


def gpu_type_name(gpu_type) -> str:
    """serverless_gpu's gpu_type ("H100", "a10", a GPUType member) or databricks.air's accelerator_type
    ("GPU_8xH100", "GPU_1xA10") as the product-name word(s) to look for: "h100", "a10"."""
    text = str(getattr(gpu_type, "value", gpu_type))
    return re.sub(r"^gpu_\d+x", "", text.strip().lower())


def overridden(settings: dict, given: dict) -> dict:
    """databricks.air's with_overrides: the decorator's arguments `settings` (as given to it) with those `given`
    changed. An argument left UNSET, or None for one of _NONE_KEEPS (but timeout), keeps its value; changing one
    spelling of a setting (num_accelerators) drops the other (gpus); an argument the decorator does not take is
    refused, naming those it takes."""
    changes = {k: v for k, v in given.items() if v is not UNSET and not (v is None and k in _NONE_KEEPS)}
    unknown = sorted(set(changes) - set(settings))
    if unknown:
        raise TypeError(f"with_overrides() got unknown argument(s) {', '.join(unknown)}: it takes "
                        f"{', '.join(settings)}")
    settings = dict(settings)
    for name, value in changes.items():
        if name in _SYNONYMS and _SYNONYMS[name] not in changes:
            settings[_SYNONYMS[name]] = None  # the other spelling's old value would contradict the new one
        settings[name] = value
    return settings


def say_what_pools_mean_here() -> None:
    set_here = [name for name in POOL_VARIABLES if os.environ.get(name)]
    if set_here:
        print(f"@distributed: {', '.join(set_here)} ignored: GPU pools are Databricks provisioning; here the ranks "
              "run on the GPUs this machine (or the attached Ray cluster) has.", file=sys.stderr)
