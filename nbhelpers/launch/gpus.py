"""How many ranks, on which GPUs: every check of `gpus` (num_accelerators) and `gpu_type` (accelerator_type), in one
place, each refusing with advice before anything starts.

- This host (the local engine, `@ray_launch(remote=False)`): `world_size` (the GPUs visible, or CPU processes, at
  most CPU_RANKS_PER_CORE per core), `check_gpu_type` and `check_node_shape` against the GPUs' product names
  (nvidia-smi; no CUDA context in this process); `check_this_host` is the decorator's call of them.
- A Ray cluster (`engine="ray"`, `@ray_launch(remote=True)`), from its `ray.cluster_resources()`:
  `cluster_world_size`, `cluster_gpu_resource`, `check_driver_cluster`.
- `check_count`: a whole number >= 1, whoever asks.

Databricks' spellings (`accelerator_type="GPU_8xH100"`) are read by nbhelpers.launch.databricks. Nothing here imports
an engine, the decorator (nbhelpers.launch.launcher) or Ray; torch only to count the visible GPUs.
"""
from __future__ import annotations

import operator
import os
import re
import subprocess
import sys

from nbhelpers.launch.databricks import accelerator_shape, gpu_type_name

DEFAULT_CPU_PROCESSES = 2  # ranks without GPUs when `gpus` is not given
CPU_RANKS_PER_CORE = 2  # without GPUs: more ranks than this per core only time-slice the cores


def check_count(gpus, name: str = "gpus") -> int:
    """`gpus` as an int: any integer type counts (numpy's, as a notebook computes it); a bool, a float, a string
    or a count below 1 is refused, naming the setting `name`."""
    try:
        count = None if isinstance(gpus, bool) else operator.index(gpus)
    except TypeError:
        count = None
    if count is None or count < 1:
        raise ValueError(f"{name} must be a whole number >= 1 (or None for every visible GPU), got {gpus!r}")
    return count


def gpu_type_matches(gpu_type, name: str) -> bool:
    """Whether a GPU of product name `name` ("NVIDIA H200", "Tesla V100-SXM2-32GB") is a `gpu_type`."""
    words = lambda text: set(re.findall(r"[a-z0-9]+", text.lower()))  # noqa: E731
    return words(gpu_type_name(gpu_type)) <= words(name)


# ---------------------------------------------------------------------------------------------------
# This host

def check_this_host(gpus: int | None, gpu_type, accelerator_type) -> None:
    """The decorator's checks of a local launch: the count (`gpus`, checked by check_count already), then the node
    shape (accelerator_type) or the GPU type."""
    if gpus is not None:
        world_size(gpus)
    if accelerator_type is not None:
        check_node_shape(accelerator_type)
    else:
        check_gpu_type(gpu_type)


def world_size(gpus) -> int:
    """How many ranks `gpus` means on this host; a count it cannot hold is refused here, with advice."""
    visible = _visible_gpu_count()
    if gpus is None:
        return visible or DEFAULT_CPU_PROCESSES
    gpus = check_count(gpus)
    if visible and gpus > visible:
        raise ValueError(
            f"gpus={gpus} but only {visible} GPU(s) are visible to this process "
            f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '<unset>')}). "
            f"Ask for at most {visible}, or leave gpus unset to use every visible GPU."
        )
    cores = _usable_cores()
    if not visible and gpus > CPU_RANKS_PER_CORE * cores:
        raise ValueError(
            f"gpus={gpus} but no GPU is visible, so every rank would be a CPU process, and this machine has "
            f"{cores} CPU core(s): at most {CPU_RANKS_PER_CORE * cores} CPU ranks ({CPU_RANKS_PER_CORE} per core) "
            f"are allowed. Ask for at most {CPU_RANKS_PER_CORE * cores}, or run where GPUs are visible."
        )
    return gpus


def check_gpu_type(gpu_type: str | None, setting: str = "gpu_type") -> list[str]:
    """gpu_type (serverless_gpu's "H100", "A10", ...) against the visible GPUs: an error naming both when
    they differ; without GPUs one line saying it is ignored. The visible GPUs' names ([] where none is)."""
    if gpu_type is None:
        return []
    visible = visible_gpus()
    if not visible:
        print(f"@distributed: {setting}={gpu_type!r} ignored: no GPU is visible here, so the ranks run as CPU "
              "processes (gloo).", file=sys.stderr)
        return []
    names = _gpu_names(visible)
    if not all(gpu_type_matches(gpu_type, n) for n in names):
        here = ", ".join(f"{n} ({names.count(n)}x)" for n in dict.fromkeys(names))
        raise ValueError(
            f"{setting}={gpu_type!r} but the GPUs visible here are {here}. Ask for the GPUs this machine has "
            f"(e.g. gpu_type={names[0].split()[-1]!r}), or leave {setting} out to take whatever is visible."
        )
    return names


def check_node_shape(accelerator_type) -> None:
    """databricks.air's accelerator_type ("GPU_8xH100": a node of 8 H100s) against this node, as databricks.air
    checks a local run: the visible GPUs are of its kind, no more than its count, and not one alone for a shape of
    several (GPU_1xH100 does not describe a node of 8; GPU_8xH100 not a single GPU). Without GPUs: ignored."""
    per_node, kind = accelerator_shape(accelerator_type)
    names = check_gpu_type(accelerator_type, "accelerator_type")
    if names and (len(names) > per_node or (per_node > 1 and len(names) == 1)):
        raise ValueError(
            f"accelerator_type={accelerator_type!r} is a node of {per_node} {kind} GPU(s), but {len(names)} are visible "
            f"here: leave accelerator_type out in a local run (every visible GPU is used; num_accelerators=N takes "
            f"fewer), or name this node's shape.")


def any_gpu_visible() -> bool:
    return _visible_gpu_count() > 0


def visible_gpus() -> list[str]:
    """The GPUs this process may use, as CUDA_VISIBLE_DEVICES names them (indices when it is unset)."""
    count = _visible_gpu_count()
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is None:
        return [str(i) for i in range(count)]
    return [g.strip() for g in listed.split(",") if g.strip()][:count]


def cpu_threads_per_rank(ranks_running: int) -> int:
    """CPU threads for each rank (OMP_NUM_THREADS, unless set): the cores shared by the ranks running now."""
    return max(1, _usable_cores() // ranks_running)


def _usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))  # the cores this process may run on (taskset, cgroup cpusets)
    except AttributeError:
        return os.cpu_count() or 1


def _visible_gpu_count() -> int:
    import torch

    return torch.cuda.device_count()  # asks NVML: does not initialise CUDA in this process


def _gpu_names(gpus: list[str]) -> list[str]:
    """The product names of these GPUs (indices or UUIDs), from nvidia-smi: no CUDA context in this process."""
    query = subprocess.run(["nvidia-smi", "--query-gpu=index,uuid,name", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=60, check=True).stdout
    rows = [[field.strip() for field in line.split(",", 2)] for line in query.splitlines() if line.strip()]
    return [next(name for index, uuid, name in rows if gpu in (index, uuid) or (not gpu.isdigit() and uuid.startswith(gpu)))
            for gpu in gpus]


# ---------------------------------------------------------------------------------------------------
# A Ray cluster (`resources`: its ray.cluster_resources())

def cluster_world_size(gpus, resources: dict) -> tuple[bool, int]:
    """(use GPUs?, number of ranks) on this cluster; a count it cannot hold is refused here."""
    cluster_gpus, cluster_cpus = int(resources.get("GPU", 0)), int(resources.get("CPU", 0))
    if cluster_gpus:
        world_size = cluster_gpus if gpus is None else gpus
        if world_size > cluster_gpus:
            raise ValueError(f"gpus={gpus} but the Ray cluster has {cluster_gpus} GPU(s) in all. Ask for at "
                             f"most {cluster_gpus}, or leave gpus unset to use every GPU of the cluster.")
        return True, world_size
    world_size = DEFAULT_CPU_PROCESSES if gpus is None else gpus
    if world_size > cluster_cpus:
        raise ValueError(f"gpus={gpus}: the Ray cluster has no GPU, and {cluster_cpus} CPU(s) in all for "
                         f"{world_size} CPU ranks of one CPU each. Ask for at most {cluster_cpus}.")
    return False, world_size


def cluster_gpu_resource(gpu_type: str | None, use_gpu: bool, resources: dict) -> dict:
    """The bundle resource that puts ranks on nodes whose GPUs are `gpu_type` (Ray labels nodes
    `accelerator_type:H100` and so on); an error naming both when the cluster has none of them."""
    if gpu_type is None:
        return {}
    if not use_gpu:
        print(f"@distributed: gpu_type={gpu_type!r} ignored: the Ray cluster has no GPU, so the ranks run as "
              "CPU processes (gloo).", file=sys.stderr)
        return {}
    types = _accelerator_types(resources)
    matching = [t for t in types if gpu_type_matches(gpu_type, t)]
    if not matching:
        raise ValueError(f"gpu_type={gpu_type!r} but the Ray cluster's GPUs are {', '.join(types) or 'of no known type'}. "
                         "Ask for one of those, or leave gpu_type out to take any GPU of the cluster.")
    return {f"accelerator_type:{matching[0]}": 0.001}


def check_driver_cluster(resources: dict, gpus: int | None, gpu_type, name: str) -> None:
    """`@ray_launch(remote=True)`: the attached cluster has `gpus` GPUs of `gpu_type`; without GPUs, one line says
    they are ignored."""
    have = int(resources.get("GPU", 0))
    if not have:
        print(f"@ray_launch: the attached Ray cluster has no GPU, so gpus={gpus} and gpu_type={gpu_type!r} "
              f"are ignored: {name}() drives a cluster of {resources.get('CPU', 0):.0f} CPU(s).", file=sys.stderr)
        return
    if gpus is not None and have < gpus:
        raise ValueError(f"@ray_launch(gpus={gpus}) but the attached Ray cluster has {have} GPU(s) in all: "
                         f"ask for at most {have}, or add GPU nodes to the cluster.")
    if gpu_type is not None:
        types = _accelerator_types(resources)
        if not any(gpu_type_matches(gpu_type, t) for t in types):
            raise ValueError(f"gpu_type={gpu_type!r} but the Ray cluster's GPUs are "
                             f"{', '.join(types) or 'of no known type'}: ask for one of those, or leave gpu_type out.")


def _accelerator_types(resources: dict) -> list[str]:
    return [k.split(":", 1)[1] for k in resources if k.startswith("accelerator_type:")]
