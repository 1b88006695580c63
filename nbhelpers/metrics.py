"""`metrics.json`: what every notebook and recipe records for its tests and benchmarks."""
from __future__ import annotations

import datetime
import json
import os
import platform
from importlib import metadata
from pathlib import Path

_PACKAGES = ("torch", "transformers", "trl", "peft", "accelerate", "deepspeed", "lightning", "unsloth", "axolotl", "ray")


def environment() -> dict:
    """Date, host, Python, package versions and visible devices: the context of a measurement."""
    import torch

    versions = {"python": platform.python_version()}
    for name in _PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    if torch.cuda.is_available():
        devices = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    else:
        devices = [f"cpu ({os.cpu_count()} cores)"]
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(),
        "versions": versions,
        "devices": devices,
    }


def peak_memory_bytes(device) -> int:
    """Peak memory of this process on `device`: CUDA allocator peak on a GPU, peak RSS on the CPU."""
    import torch

    if getattr(device, "type", str(device)) == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    import resource

    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # Linux reports KiB


def write_metrics(output_dir, **metrics) -> Path:
    """Write `output_dir/metrics.json` (atomically) with the metrics and the environment; return its path."""
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "metrics.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps({**metrics, "environment": environment()}, indent=2, default=float))
    os.replace(tmp, path)
    return path
