"""Launch overhead: a trivial function on 2 ranks (init_process_group + barrier), four launchers.

    python benchmarks/launch_overhead.py [--repeats 10] [--out benchmarks/results/launch_overhead_cpu.json]

Side by side in one run: `@distributed`, the `torchrun` command line running the same function from
a script, `torch.multiprocessing.spawn`, and accelerate's `notebook_launcher` (fork-based). "first" is
a fresh Python process that has imported torch (as a notebook has) launching once; "warm" is a
repeated launch from that process. Medians of --repeats runs each. gloo on CPU, nccl on GPUs.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve()


def trivial(rank=None, world_size=2):
    """init_process_group + barrier: the work every launcher must at least make possible."""
    import torch
    import torch.distributed as dist

    if rank is not None:  # mp.spawn passes the rank; the others set the environment
        os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size))
    use_cuda = torch.cuda.is_available()
    if use_cuda:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl" if use_cuda else "gloo")
    dist.barrier()
    dist.destroy_process_group()
    return int(os.environ["RANK"])


def _free_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(variant: str):
    if variant == "distributed":
        from nbhelpers import distributed

        return distributed(gpus=2)(trivial).distributed()
    if variant == "mp_spawn":
        import torch.multiprocessing as mp

        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
        mp.spawn(trivial, args=(2,), nprocs=2, join=True)
        return
    if variant == "accelerate_notebook_launcher":
        from accelerate import notebook_launcher

        use_cuda = __import__("torch").cuda.is_available()
        notebook_launcher(trivial, num_processes=2, use_port=str(_free_port()), **({} if use_cuda else {"mixed_precision": "no"}))
        return
    raise ValueError(variant)


def in_process(variant: str, repeats: int):
    """Run inside a fresh Python: time the first launch, then `repeats` warm ones."""
    import torch  # noqa: F401  (a notebook has imported torch before it launches)

    started = time.perf_counter()
    launch(variant)
    first = time.perf_counter() - started
    warm = []
    for _ in range(repeats):
        started = time.perf_counter()
        launch(variant)
        warm.append(time.perf_counter() - started)
    print(json.dumps({"first": first, "warm": warm}))


def measure(variant: str, repeats: int) -> dict:
    if variant == "torchrun":
        times = []
        for _ in range(repeats):
            started = time.perf_counter()
            subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                            str(HERE), "--as-torchrun-script"], check=True, capture_output=True)
            times.append(time.perf_counter() - started)
        return {"first_median_s": statistics.median(times), "warm_median_s": statistics.median(times),
                "first_s": times, "warm_s": times}
    firsts, warms = [], []
    for _ in range(repeats):  # each first launch in a fresh process; the warm ones from the first process
        run = subprocess.run([sys.executable, str(HERE), "--in-process", variant,
                              "--repeats", str(repeats if not warms else 0)], capture_output=True, text=True)
        if run.returncode != 0:
            return {"failed": run.stderr.strip().splitlines()[-1] if run.stderr.strip() else f"exit {run.returncode}"}
        timing = json.loads(run.stdout.strip().splitlines()[-1])
        firsts.append(timing["first"])
        warms += timing["warm"]
    return {"first_median_s": statistics.median(firsts), "warm_median_s": statistics.median(warms),
            "first_s": firsts, "warm_s": warms}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--in-process")
    parser.add_argument("--as-torchrun-script", action="store_true")
    args = parser.parse_args()
    if args.as_torchrun_script:
        trivial()
        return
    if args.in_process:
        in_process(args.in_process, args.repeats)
        return

    sys.path.insert(0, str(HERE.parents[1]))
    from nbhelpers.training.metrics import environment

    results = {}
    for variant in ("distributed", "torchrun", "mp_spawn", "accelerate_notebook_launcher"):
        results[variant] = r = measure(variant, args.repeats)
        if "failed" in r:
            print(f"{variant:30s} failed: {r['failed']}", flush=True)
        else:
            print(f"{variant:30s} first {r['first_median_s']:.2f} s   warm {r['warm_median_s']:.2f} s", flush=True)
    torchrun = results["torchrun"]["first_median_s"]
    summary = {
        "distributed_first_vs_torchrun": results["distributed"]["first_median_s"] / torchrun,
        "distributed_warm_s": results["distributed"]["warm_median_s"],
        "goals": {"first_vs_torchrun_at_most": 0.5, "warm_s_at_most": 0.5},
    }
    print(json.dumps(summary, indent=1))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"what": "launch overhead, 2 ranks, init_process_group + barrier",
                                        "repeats": args.repeats, "results": results, "summary": summary,
                                        "environment": environment()}, indent=1))


if __name__ == "__main__":
    main()
