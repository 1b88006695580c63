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


def write_metrics(output_dir, results=None, /, **metrics) -> Path:
    """Write `output_dir/metrics.json` (atomically): the metrics, the ranks' results and the environment.

    results: what `train.distributed(args)` returned, one dict per rank in rank order (or None). It adds
        `world_size` (the number of ranks) and, for each key of the ranks' dicts, the list of the ranks'
        values (`peak_memory_bytes: [rank 0's, rank 1's]`). A value that is not JSON (a tensor of many
        numbers, a model) is left out, and the key is printed; a one-number tensor becomes that number. Where the
        launch timed the ranks' steps (nbhelpers.training.step_times), `step_times` holds its figures: each rank's
        median data wait, forward pass and step, and `straggler_rank` / `straggler`, the rank that held the others
        back and why (null when the ranks were even).
    metrics: written as given, at the top level: what a reader means by the name (the loss curve every
        rank agrees on, the job's throughput). A name given here replaces the ranks' list of that name.
        `losses` (a list of numbers) also gives `initial_loss`, `final_loss` and `final_loss_vs_initial`.
    Facts that mean nothing with one rank (e.g. "identical on all ranks") are passed as None: JSON null.
    """
    record = {}
    if results is not None:
        record["world_size"] = len(results)
        left_out = set()
        for key in dict.fromkeys(k for result in results for k in result):
            values = [_as_json(result.get(key)) for result in results]
            if any(v is _NOT_JSON for v in values):
                left_out.add(key)
            else:
                record[key] = values
        if left_out - set(metrics):
            print(f"metrics.json leaves out the ranks' {', '.join(sorted(left_out - set(metrics)))} (not JSON)")
        if getattr(results, "step_times", None) is not None:  # a launch's RankResults
            record["step_times"] = results.step_times
    record.update(metrics)
    losses = metrics.get("losses")
    if losses and all(isinstance(loss, (int, float)) for loss in (losses[0], losses[-1])):
        record.setdefault("initial_loss", losses[0])
        record.setdefault("final_loss", losses[-1])
        if losses[0]:
            record.setdefault("final_loss_vs_initial", losses[-1] / losses[0])
    record["environment"] = environment()
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "metrics.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(record, indent=2, default=float))
    os.replace(tmp, path)
    return path


_NOT_JSON = object()


def _as_json(value):
    """`value` as JSON can hold it (one-number tensors as numbers), or _NOT_JSON."""
    if hasattr(value, "numel") and value.numel() == 1:
        return value.item()
    try:
        json.dumps(value, default=float)
    except (TypeError, ValueError, RuntimeError):
        return _NOT_JSON
    return value
