"""The `@distributed` launcher: one test per behaviour of DESIGN.md's contract (CPU, gloo, 2 ranks)."""
import json
import multiprocessing
import os
import re
import subprocess
import sys
import threading
import time

import psutil
import pytest
import torch
import torch.distributed as dist

import nbhelpers.launcher as launcher
from nbhelpers import DistributedError, backend, distributed
from timed_stream import TimedStream

TORCHRUN_KEYS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
INFRASTRUCTURE = ("multiprocessing.forkserver", "multiprocessing.resource_tracker")


def leftover_processes(root_pid=None):
    """Descendants of `root_pid` (default: this process) except the idle fork server (kept for fast
    relaunches) and multiprocessing's resource tracker. Ranks and anything they started count."""
    root = psutil.Process(root_pid or os.getpid())
    left = []
    for p in root.children(recursive=True):
        try:
            # Ranks are forks of the server and share its command line: only the server itself,
            # a direct child of root, is infrastructure.
            is_infrastructure = p.ppid() == root.pid and any(m in " ".join(p.cmdline()) for m in INFRASTRUCTURE)
            if p.status() == psutil.STATUS_ZOMBIE or is_infrastructure:
                continue
        except psutil.Error:
            continue
        left.append(p)
    return left


def assert_nothing_left_running(root_pid=None):
    deadline = time.monotonic() + 2  # the kernel reaps asynchronously
    while (left := leftover_processes(root_pid)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not left, f"processes left running: {[(p.pid, p.cmdline()) for p in left]}"


# --- how many processes --------------------------------------------------------------------------

def test_without_gpus_the_default_is_two_cpu_processes_on_gloo():
    @distributed
    def world():
        dist.init_process_group(backend())
        facts = (dist.get_world_size(), dist.get_backend())
        dist.destroy_process_group()
        return facts

    assert world.distributed() == [(2, "gloo"), (2, "gloo")]


def test_gpus_sets_the_number_of_cpu_processes_without_gpus():
    @distributed(gpus=3)
    def rank():
        return int(os.environ["RANK"])

    assert rank.distributed() == [0, 1, 2]


def test_more_gpus_than_visible_is_refused_before_anything_starts(monkeypatch):
    monkeypatch.setattr(launcher, "_visible_gpu_count", lambda: 2)
    with pytest.raises(ValueError, match=r"gpus=4 but only 2 GPU\(s\) are visible"):
        distributed(gpus=4)(lambda: None)
    decorated = distributed(lambda: None)
    decorated.gpus = 4
    with pytest.raises(ValueError, match="only 2 GPU"):
        decorated.distributed()
    assert_nothing_left_running()


@pytest.mark.parametrize("bad", [0, -1, 1.5, "2", True])
def test_gpus_below_one_or_not_a_whole_number_is_refused(bad):
    with pytest.raises(ValueError, match="gpus must be a whole number >= 1"):
        distributed(gpus=bad)(lambda: None)


def test_with_gpus_visible_the_default_is_one_process_per_gpu(monkeypatch):
    monkeypatch.setattr(launcher, "_visible_gpu_count", lambda: 3)
    assert launcher._world_size(None) == 3


# --- how the processes are made ------------------------------------------------------------------

def test_ranks_are_not_forked_from_the_calling_process():
    json._marker_set_in_the_caller = True  # a fork of this process would inherit it

    @distributed
    def origin():
        return os.getppid(), hasattr(json, "_marker_set_in_the_caller")

    try:
        results = origin.distributed()
    finally:
        del json._marker_set_in_the_caller
    for parent, inherited in results:
        assert parent != os.getpid()
        assert not inherited
        assert "forkserver" in " ".join(psutil.Process(parent).cmdline())


def test_functions_and_classes_defined_in_the_caller_travel_by_value():
    class Accumulator:  # a local class: importable from nowhere, so it must be pickled by value
        def __init__(self, start):
            self.total = start

        def add(self, x):
            self.total += x
            return self

    def square(x):
        return x * x

    @distributed
    def use_them(acc):
        return acc.add(square(int(os.environ["RANK"]) + 2)).total

    assert use_them.distributed(Accumulator(10)) == [14, 19]


def test_an_unpicklable_capture_is_named_in_the_error():
    lock = threading.Lock()

    @distributed
    def uses_lock():
        with lock:
            return 1

    with pytest.raises(TypeError, match=r"captured variable 'lock' \(lock\) cannot be pickled"):
        uses_lock.distributed()
    assert_nothing_left_running()


def test_an_unpicklable_argument_is_named_in_the_error():
    @distributed
    def takes(data, handle):
        return 1

    with pytest.raises(TypeError, match=r"argument 'handle' \(lock\)"):
        takes.distributed([1, 2], handle=threading.Lock())


# --- the environment -------------------------------------------------------------------------------

def test_each_rank_gets_the_torchrun_environment_with_a_free_loopback_port():
    @distributed
    def environment():
        return {k: os.environ[k] for k in TORCHRUN_KEYS}

    envs = environment.distributed()
    assert [e["RANK"] for e in envs] == ["0", "1"]
    assert [e["LOCAL_RANK"] for e in envs] == ["0", "1"]
    assert {e["WORLD_SIZE"] for e in envs} == {"2"}
    assert {e["LOCAL_WORLD_SIZE"] for e in envs} == {"2"}
    assert {e["MASTER_ADDR"] for e in envs} == {"127.0.0.1"}
    assert len({e["MASTER_PORT"] for e in envs}) == 1 and int(envs[0]["MASTER_PORT"]) > 0


def test_ranks_see_the_callers_current_environment_variables(monkeypatch):
    monkeypatch.setenv("COOKBOOK_SETTING", "set-after-the-server-started")

    @distributed
    def read():
        return os.environ.get("COOKBOOK_SETTING")

    assert read.distributed() == ["set-after-the-server-started"] * 2



def test_ranks_start_subprocesses_with_the_platforms_default_method_as_under_torchrun():
    @distributed
    def start_method():
        return multiprocessing.get_start_method()

    platform_default = multiprocessing.get_all_start_methods()[0]  # documented: the default comes first
    assert start_method.distributed() == [platform_default] * 2, "DataLoader workers would start differently"


CONCURRENT_LAUNCH = """
import torch, torch.distributed as dist
from nbhelpers import distributed
@distributed
def total():
    dist.init_process_group("gloo")
    t = torch.ones(1)
    dist.all_reduce(t)
    dist.destroy_process_group()
    return t.item()
print(total.distributed())
"""


def test_two_launches_at_the_same_time_on_one_host_both_succeed():
    procs = [subprocess.Popen([sys.executable, "-c", CONCURRENT_LAUNCH], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=600) for p in procs]  # generous: a loaded 2-core machine is slow to start torch
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err
        assert "[2.0, 2.0]" in out


# --- results and plain calls -----------------------------------------------------------------------

def test_results_come_back_in_rank_order_with_tensors_on_the_cpu():
    @distributed(gpus=3)
    def result():
        rank = int(os.environ["RANK"])
        time.sleep(0.3 * (2 - rank))  # finish in reverse order
        return {"rank": rank, "tensor": torch.full((2,), float(rank))}

    results = result.distributed()
    assert [r["rank"] for r in results] == [0, 1, 2]
    for r in results:
        assert r["tensor"].device.type == "cpu"
        assert torch.equal(r["tensor"], torch.full((2,), float(r["rank"])))


def test_a_plain_call_runs_in_this_process_as_rank_zero_of_one():
    @distributed
    def where():
        dist.init_process_group(backend())
        facts = os.getpid(), dist.get_rank(), dist.get_world_size()
        return facts

    assert where() == (os.getpid(), 0, 1)
    assert not dist.is_initialized()  # the group it left open was closed
    assert "RANK" not in os.environ


# --- output ----------------------------------------------------------------------------------------


def test_each_ranks_output_streams_live_with_its_rank_as_prefix(monkeypatch):
    stream = TimedStream()
    monkeypatch.setattr(sys, "stdout", stream)

    @distributed
    def talk():
        print(f"starting on {os.environ['RANK']}")
        time.sleep(2)
        print("done")

    talk.distributed()
    returned = time.monotonic()
    text = stream.text()
    assert "[rank 0] starting on 0\n" in text and "[rank 1] starting on 1\n" in text
    assert "[rank 0] done\n" in text and "[rank 1] done\n" in text
    first = next(t for t, piece in stream.pieces if "starting" in piece)
    assert returned - first > 1.5, "output arrived only when the ranks finished, not while they ran"


def test_progress_bar_redraws_keep_their_carriage_returns(monkeypatch):
    stream = TimedStream()
    monkeypatch.setattr(sys, "stderr", stream)

    @distributed
    def bar():
        for i in range(3):
            sys.stderr.write(f"step {i}\r")
            sys.stderr.flush()
        sys.stderr.write("\n")

    bar.distributed()
    assert "[rank 0] step 0\r[rank 0] step 1\r[rank 0] step 2\r\n" in stream.text()


def test_output_rank0_shows_only_rank_zero(monkeypatch):
    stream = TimedStream()
    monkeypatch.setattr(sys, "stdout", stream)

    @distributed(output="rank0")
    def talk():
        print("hi")

    talk.distributed()
    assert "[rank 0] hi" in stream.text() and "[rank 1]" not in stream.text()


# --- failures --------------------------------------------------------------------------------------

def _fails_on_rank_1():
    dist.init_process_group("gloo")
    if dist.get_rank() == 1:
        raise ValueError(f"no shard for rank 1; failed at {time.time()}")
    dist.barrier()  # rank 0 would wait here for ever


def test_leftover_processes_sees_running_ranks():
    @distributed
    def count_while_running():
        time.sleep(1.5)

    found = []
    watcher = threading.Thread(target=lambda: (time.sleep(0.8), found.append(len(leftover_processes()))))
    watcher.start()
    count_while_running.distributed()
    watcher.join()
    assert found == [2], "the process counter used by these tests must see the ranks"
    assert_nothing_left_running()


def test_a_failing_rank_raises_one_error_naming_it_with_its_traceback_within_5_s():
    with pytest.raises(DistributedError) as caught:
        distributed(_fails_on_rank_1).distributed()
    raised_at = time.time()
    err = caught.value
    failed_at = float(re.search(r"failed at ([0-9.]+)", str(err)).group(1))
    assert err.rank == 1
    assert str(err).startswith("rank 1 of 2 failed in _fails_on_rank_1(): ValueError: no shard for rank 1")
    assert "Traceback (most recent call last)" in err.remote_traceback
    assert 'raise ValueError(f"no shard for rank 1' in err.remote_traceback
    assert raised_at - failed_at < 5.0
    assert_nothing_left_running()


@pytest.mark.parametrize("attempt", range(20))
def test_a_failure_leaves_no_process_running(attempt):
    with pytest.raises(DistributedError, match="rank 1 of 2 failed"):
        distributed(_fails_on_rank_1).distributed()
    assert_nothing_left_running()


def test_processes_a_rank_started_in_their_own_session_are_stopped_too():
    @distributed
    def spawns_then_fails():
        child = subprocess.Popen(["sleep", "300"], start_new_session=True)
        if int(os.environ["RANK"]) == 1:
            time.sleep(0.5)
            raise RuntimeError(f"child {child.pid} is running")
        time.sleep(300)

    with pytest.raises(DistributedError, match="rank 1"):
        spawns_then_fails.distributed()
    assert_nothing_left_running()
    sleepers = [p for p in psutil.process_iter(["cmdline"]) if p.info["cmdline"] == ["sleep", "300"]]
    assert not sleepers, f"left running: {sleepers}"


def test_a_rank_killed_by_a_signal_is_named_with_the_signal():
    @distributed
    def killed():
        import signal

        if int(os.environ["RANK"]) == 1:
            print("about to be killed")
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(300)

    with pytest.raises(DistributedError) as caught:
        killed.distributed()
    err = caught.value
    assert (err.rank, err.signal_name) == (1, "SIGKILL")
    assert "rank 1 of 2 was killed by signal SIGKILL" in str(err)
    assert "[rank 1] about to be killed" in str(err)
    assert_nothing_left_running()


def test_a_rank_that_exits_without_returning_is_an_error():
    @distributed
    def exits():
        if int(os.environ["RANK"]) == 0:
            os._exit(3)
        time.sleep(300)

    with pytest.raises(DistributedError, match="rank 0 of 2 exited with code 3 without returning"):
        exits.distributed()
    assert_nothing_left_running()


def test_a_stall_dumps_every_ranks_python_stack_then_kills_them():
    @distributed(stall_timeout=2)
    def stalls():
        def wait_here_for_ever():
            time.sleep(300)

        print("started")
        wait_here_for_ever()

    started = time.monotonic()
    with pytest.raises(DistributedError) as caught:
        stalls.distributed()
    message = str(caught.value)
    assert time.monotonic() - started < 15
    assert "no rank of stalls() made progress (no output) for 2 s" in message
    for rank in (0, 1):
        section = message.split(f"--- rank {rank} ---")[1].split("--- rank")[0]
        assert "wait_here_for_ever" in section, f"rank {rank}'s stack is missing:\n{message}"
    assert_nothing_left_running()


KERNEL_LAUNCH = """
import time
from nbhelpers import distributed

@distributed
def sleeps():
    print("ranks are running", flush=True)
    time.sleep(300)
"""


def test_interrupting_the_kernel_stops_every_rank():
    from jupyter_client.manager import start_new_kernel

    km, kc = start_new_kernel(kernel_name="python3")
    try:
        kc.execute_interactive(KERNEL_LAUNCH, timeout=60)
        msg_id = kc.execute("sleeps.distributed()")
        seen = ""
        deadline = time.monotonic() + 60
        while seen.count("ranks are running") < 2 and time.monotonic() < deadline:
            msg = kc.get_iopub_msg(timeout=60)
            if msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "stream":
                seen += msg["content"]["text"]
        assert "[rank 1] ranks are running" in seen
        kernel_pid = km.provisioner.process.pid
        assert len(leftover_processes(kernel_pid)) >= 2
        km.interrupt_kernel()
        reply = kc.get_shell_msg(timeout=30)
        assert reply["content"]["status"] == "error"
        assert reply["content"]["ename"] == "KeyboardInterrupt"
        assert_nothing_left_running(kernel_pid)
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
