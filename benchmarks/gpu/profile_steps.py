"""Run a training script under torch.profiler: skip WAIT optimizer steps, warm up one, record two, then write the
kernel table (self GPU time) and the step times to OUT.txt, from the optimizer-step hook itself (the recipes end
with os._exit, which skips atexit).
usage: python3 profile_steps.py OUT WAIT script.py [args...]   (under torchrun too: rank 0 writes)"""
import os
import runpy
import sys
import time

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.profiler import ProfilerActivity, profile, schedule

out, wait, script = sys.argv[1], int(sys.argv[2]), sys.argv[3]
sys.argv = sys.argv[3:]
sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
times = []
profiler = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
                   schedule=schedule(wait=wait, warmup=1, active=2, repeat=1))
profiler.start()


def write_table():
    profiler.stop()
    if int(os.environ.get("RANK", "0")) != 0:
        return
    events = profiler.key_averages()
    key = "self_device_time_total" if hasattr(events[0], "self_device_time_total") else "self_cuda_time_total"
    busy = sum(getattr(e, key) for e in events if e.device_type == torch.autograd.DeviceType.CUDA) / 1e6
    steps = [b - a for a, b in zip(times, times[1:])]
    recorded = sum(steps[-2:])
    with open(out + ".txt", "w") as f:
        f.write(f"step times (s) {[round(x, 3) for x in steps]}\n")
        f.write(f"recorded 2 steps: wall {recorded:.3f} s; GPU kernels busy {busy:.3f} s\n\n")
        f.write(events.table(sort_by=key, row_limit=45, max_name_column_width=90))


def on_step(optimizer, args, kwargs):
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    times.append(time.perf_counter())
    profiler.step()
    if len(times) == wait + 3:
        write_table()


register_optimizer_step_post_hook(on_step)
runpy.run_path(script, run_name="__main__")
