"""Issue 62 on one GPU: the straggler report's NVML path reads the GPU's clock, temperature and throttle reasons, and
says nothing (one rank cannot straggle).

    python3 benchmarks/gpu/stragglers_nvml.py OUT.json [SECONDS]     # through benchmarks/gpu/stragglers.sh

One `@distributed(gpus=1)` launch trains an MLP (4 layers of 4096, batch 8192, TF32) on the GPU for SECONDS (default
30) with StepTimes, so NVML sees the GPU busy. Checks, each said in one line (exit code 1 if any fails): the launch's
system metrics hold the GPU's SM clock while busy, its temperature and what held its clock down (a list, empty when
nothing did); its step times hold the rank's forward passes (CUDA events) and steps; no straggler is named and no
report line was printed. Writes OUT.json: the system metrics, the step times, the captured launcher output's lines.
"""
import contextlib
import io
import json
import sys
import time

import torch
import torch.distributed as dist
from torch import nn

from nbhelpers import backend, distributed
from nbhelpers.training.step_times import StepTimes


@distributed(gpus=1)
def train(seconds: float) -> dict:
    dist.init_process_group(backend())
    device = torch.device("cuda", 0)
    torch.set_float32_matmul_precision("high")  # TF32
    layers = [m for _ in range(4) for m in (nn.Linear(4096, 4096), nn.ReLU())]
    model = nn.parallel.DistributedDataParallel(nn.Sequential(*layers, nn.Linear(4096, 1)).to(device))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
    step_times = StepTimes(model)
    steps, started = 0, time.monotonic()
    while time.monotonic() - started < seconds:
        batch = torch.randn(8192, 4096, device=device)
        loss = model(batch).square().mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        step_times.step_done()
        steps += 1
        if steps % 20 == 0:
            loss.item()  # as a loop that logs its loss now and then
    step_times.close()
    dist.destroy_process_group()
    return {"steps": steps, "device": torch.cuda.get_device_name(0)}


def main():
    out, seconds = sys.argv[1], float(sys.argv[2]) if len(sys.argv) > 2 else 30.0
    import importlib.util
    missing = [name for name in ("pynvml", "psutil", "cloudpickle") if importlib.util.find_spec(name) is None]
    if missing or not torch.cuda.is_available():
        sys.exit(f"stragglers_nvml.py: needs a GPU and {missing or 'nothing more'} importable (nvidia-ml-py: "
                 "benchmarks/gpu/pack-extra.sh; psutil: pack-site.sh; carry .devsite)")
    captured = io.StringIO()
    with contextlib.redirect_stderr(captured):  # what the launcher says on this process's stderr (and the rank's)
        results = train.distributed(seconds)
    text = captured.getvalue()
    sys.stderr.write(text)
    system, steps = results.system_metrics or {}, results.step_times or {}
    checks = {
        "the GPU's SM clock was read while busy": ((system.get("gpu_sm_clock_mhz_median") or [None])[0] or 0) > 0,
        "its temperature was read": (system.get("gpu_temperature_celsius_max") or [None])[0] is not None,
        "what held its clock down was read (a list, empty when nothing did)":
            isinstance((system.get("gpu_clock_limited_by") or [None])[0], list),
        "the rank's forward passes were timed (CUDA events)": ((steps.get("forward_s") or [None])[0] or 0) > 0,
        "its steps were recorded": ((steps.get("steps") or [None])[0] or 0) > 10,
        "no straggler named": steps.get("straggler_rank") is None and steps.get("straggler") is None,
        "no report line printed": "slower than the median rank" not in text,
    }
    report = {"device": results[0]["device"], "steps": results[0]["steps"], "system_metrics": system,
              "step_times": steps, "checks": checks, "launcher_output": text.splitlines()}
    with open(out, "w") as f:
        json.dump(report, f, indent=2, default=str)
    for what, ok in checks.items():
        print(f"{'ok  ' if ok else 'FAIL'} {what}")
    print(f"{results[0]['device']}: {results[0]['steps']} steps; SM clock {system.get('gpu_sm_clock_mhz_median')} MHz, "
          f"{system.get('gpu_temperature_celsius_max')} °C max, held down by {system.get('gpu_clock_limited_by')}; "
          f"forward {steps.get('forward_s')} s, step {steps.get('step_s')} s")
    sys.exit(0 if all(checks.values()) else 1)


if __name__ == "__main__":
    main()
