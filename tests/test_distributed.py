"""The `@distributed` launcher: one test per behaviour of its contract (README, "How `@distributed` works"; CPU, gloo,
2 ranks)."""
import ast
import concurrent.futures
import contextlib
import json
import linecache
import multiprocessing
import os
import queue
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

from pathlib import Path

import numpy as np
import psutil
import pytest
import torch
import torch.distributed as dist
import yaml

import nbhelpers
import nbhelpers.launch.fork_server as fork_server
import nbhelpers.launch.gpus as gpus
import nbhelpers.launch.local_engine as local_engine
import nbhelpers.launch.processes as processes
from nbhelpers import DistributedError, backend, distributed
from nbhelpers.launch.gpu_lease import GpuLease
from launcher_checks import (assert_a_rank_stuck_in_a_collective_is_a_stall, assert_a_stall_names_every_ranks_stack,
                             assert_nothing_left_running, leftover_processes, simulate_gpus)
from timed_stream import TimedStream

TORCHRUN_KEYS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
# --- the package -----------------------------------------------------------------------------------

def nbhelpers_imports() -> dict:
    """{module: the nbhelpers modules its code imports}, imports inside functions (lazy) included."""
    package = Path(nbhelpers.__file__).parent

    def name(path: Path) -> str:  # nbhelpers/launch/__init__.py: nbhelpers.launch; nbhelpers/launch/payload.py: ...
        parts = ("nbhelpers", *path.relative_to(package).with_suffix("").parts)
        return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)

    paths = {name(path): path for path in package.rglob("*.py")}
    graph = {}
    for module, path in paths.items():
        imported = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                here = module if path.stem == "__init__" else module.rpartition(".")[0]  # what `from .` names
                for _ in range(node.level - 1):
                    here = here.rpartition(".")[0]
                base = node.module if not node.level else ".".join(filter(None, [here, node.module]))
                submodules = {f"{base}.{a.name}" for a in node.names} & paths.keys()
                imported |= submodules or {base}  # `from nbhelpers.launch import local_engine` imports the submodule
        graph[module] = (imported & paths.keys()) - {module}
    return graph


def test_the_import_graph_of_nbhelpers_has_no_circle():
    graph = nbhelpers_imports()
    done, path = set(), []

    def visit(module):
        assert module not in path, "import circle: " + " -> ".join(path[path.index(module):] + [module])
        if module in done:
            return
        path.append(module)
        for imported in sorted(graph[module]):
            visit(imported)
        path.pop()
        done.add(module)

    for module in sorted(graph):
        visit(module)


ENGINES = {"nbhelpers.launch.local_engine", "nbhelpers.launch.ray_engine"}
DECORATORS = {"nbhelpers", "nbhelpers.launch.launcher", "nbhelpers.launch.ray_launcher"}


def test_the_engines_import_neither_each_other_nor_the_decorator():
    graph = nbhelpers_imports()
    for engine in ENGINES:
        assert {"nbhelpers.launch.errors", "nbhelpers.launch.output", "nbhelpers.launch.payload",
                "nbhelpers.launch.processes", "nbhelpers.launch.stalls", "nbhelpers.launch.gpus"} <= graph[engine]
        assert not graph[engine] & (ENGINES | DECORATORS), graph[engine]


def test_what_the_engines_share_imports_no_engine_and_no_decorator():
    graph = nbhelpers_imports()
    shared = {m for m in graph if m.startswith("nbhelpers.launch.")} - ENGINES - DECORATORS - {"nbhelpers.launch.commands"}
    assert {"nbhelpers.launch.errors", "nbhelpers.launch.output", "nbhelpers.launch.stalls"} <= shared
    for module in shared:
        assert not graph[module] & (ENGINES | DECORATORS), (module, graph[module])
    # the error family and the output import nothing of nbhelpers, nor does what travels to a rank
    assert graph["nbhelpers.launch.errors"] == graph["nbhelpers.launch.output"] == graph["nbhelpers.launch.payload"] == set()


def test_no_module_is_named_for_what_is_shared_instead_of_the_question_it_answers():
    graph = nbhelpers_imports()
    vague = [m for m in graph if m.rpartition(".")[2] in ("core", "common", "utils", "engine_core", "helpers", "misc")]
    assert not vague, vague


def test_importing_nbhelpers_imports_nothing_of_ray():
    script = "import json, sys, nbhelpers; print(json.dumps(sorted(sys.modules)))"
    loaded = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    assert not {"ray", "nbhelpers.launch.ray_engine", "nbhelpers.launch.ray_launcher"} & set(json.loads(loaded)), loaded


def test_without_ray_installed_each_ray_launch_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # what `import ray` finds where Ray is not installed: nothing
    launches = {'@distributed(engine="ray")': lambda: distributed(engine="ray")(print).distributed(),
                "@ray_launch": lambda: nbhelpers.ray_launch(print).distributed(),
                "remote=True": lambda: distributed(remote=True)(print)}
    for name, launch in launches.items():
        with pytest.raises(ModuleNotFoundError, match=re.escape(f'{name} runs on Ray, which is not installed here: '
                                                                'pip install ".[ray]"')):
            launch()


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
    monkeypatch.setattr(gpus, "_visible_gpu_count", lambda: 2)
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


@pytest.mark.parametrize("setting", ["gpus", "num_accelerators"])
def test_a_numpy_integer_is_a_whole_number_of_gpus(setting):
    counted = distributed(**{setting: np.int64(2)})(_rank)  # what a notebook computes: len(...) // 2, np.sum(...)
    assert counted.gpus == 2 and type(counted.gpus) is int
    assert counted.distributed() == [0, 1]


@pytest.mark.parametrize("bad", [2.5, np.float64(2.0), "2", np.True_, True])
def test_num_accelerators_that_is_not_a_whole_number_is_refused_by_its_name(bad):
    message = rf"num_accelerators must be a whole number >= 1 .*, got {re.escape(repr(bad))}"
    with pytest.raises(ValueError, match=message):
        distributed(num_accelerators=bad)(lambda: None)


def test_with_gpus_visible_the_default_is_one_process_per_gpu(monkeypatch):
    monkeypatch.setattr(gpus, "_visible_gpu_count", lambda: 3)
    assert gpus.world_size(None) == 3


def test_without_gpus_more_cpu_ranks_than_the_cores_hold_are_refused_before_anything_starts(monkeypatch):
    monkeypatch.setattr(gpus, "_visible_gpu_count", lambda: 0)
    cores = gpus._usable_cores()
    message = (rf"gpus=1000000 but no GPU is visible, so every rank would be a CPU process, and this machine has "
               rf"{cores} CPU core\(s\): at most {2 * cores} CPU ranks")
    with pytest.raises(ValueError, match=message):
        distributed(gpus=10**6)(lambda: None)
    decorated = distributed(lambda: None)
    decorated.gpus = 10**6
    with pytest.raises(ValueError, match=message):
        decorated.distributed()
    assert not leftover_processes(), "a process was started before the refusal"


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


# A fresh process, since a process has one fork server, started by its first launch. The rank reads its parent's
# (the fork server's) memory map: PyYAML's C extension is there only if the server imported yaml.
FORK_SERVER_SCRIPT = """
import json, os
import yaml
from nbhelpers import distributed


def parse(text):
    return yaml.safe_load(text)


@distributed(gpus=2)
def check():
    return parse("a: 1") == {"a": 1}, "/yaml/" in open(f"/proc/{os.getppid()}/maps").read()


print(json.dumps(check.distributed()))
"""


@pytest.mark.parametrize("hooks, imported_by_the_server", [("", True), ("simulate_gpus=2", False)],
                         ids=["without GPUs", "with GPUs"])  # simulated: the ranks still run on the CPU
def test_the_fork_server_imports_the_installed_modules_the_function_uses_only_without_gpus(
        hooks, imported_by_the_server, tmp_path, monkeypatch):
    monkeypatch.setenv("COOKBOOK_TEST_HOOKS", hooks)
    monkeypatch.setenv("COOKBOOK_TEST_HOOKS_DIR", str(tmp_path))
    proc = subprocess.run([sys.executable, "-c", FORK_SERVER_SCRIPT], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.splitlines()[-1]) == [[True, imported_by_the_server]] * 2, proc.stdout


def _parse(text):
    return yaml.safe_load(text), np.zeros(1)


def _uses_a_helper():
    return _parse(json.dumps({})), torch.ones(1), psutil.Process()


def test_the_modules_to_import_once_are_those_of_installed_packages_in_import_order():
    modules = fork_server.modules_to_import_once(_uses_a_helper)
    assert modules == sorted(modules, key=list(sys.modules).index)  # unsloth, say, before transformers
    assert {"numpy", "torch", "psutil", "yaml"} <= set(modules), modules  # also through the function it calls
    assert "json" not in modules and __name__ not in modules  # the standard library; this file (it travels by value)


class _AnswersNoQuestion:
    def __getattr__(self, name):
        raise RuntimeError(f"no {name} here")


_ANSWERS_NO_QUESTION = _AnswersNoQuestion()


def test_a_function_referring_to_an_object_that_cannot_be_inspected_still_launches():
    @distributed(gpus=2)
    def refers_to_it():
        return type(_ANSWERS_NO_QUESTION).__name__

    assert refers_to_it.distributed() == ["_AnswersNoQuestion"] * 2


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


def test_init_process_group_returns_once_every_rank_joined_unless_the_user_says_otherwise(monkeypatch):
    # without torch's barrier after init, a rank that ends right after init_process_group can close its connections
    # while a slower peer still makes them: "Gloo connectFullMesh failed ... Connection closed by peer" (the
    # getting-started notebook's hello, under load)
    @distributed
    def barrier_after_init():
        return os.environ.get("TORCH_DIST_INIT_BARRIER")

    assert barrier_after_init.distributed() == ["1", "1"]
    monkeypatch.setenv("TORCH_DIST_INIT_BARRIER", "0")
    assert barrier_after_init.distributed() == ["0", "0"]
    assert barrier_after_init() == "0"  # a plain call leaves the user's setting as it was
    assert os.environ["TORCH_DIST_INIT_BARRIER"] == "0"


def listening_sockets(pids):
    return [c for c in psutil.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN and c.pid in pids]


LOOPBACK = {"127.0.0.1", "::1", "::ffff:127.0.0.1"}


def test_nothing_a_launch_opens_listens_beyond_loopback(tmp_path):
    @distributed
    def rendezvous_then_wait(ready_dir):
        dist.init_process_group("gloo")
        dist.all_reduce(torch.ones(1))
        open(os.path.join(ready_dir, os.environ["RANK"]), "w").close()
        while not os.path.exists(os.path.join(ready_dir, "listed")):
            time.sleep(0.05)
        dist.barrier()
        dist.destroy_process_group()
        return int(os.environ["MASTER_PORT"])

    me = psutil.Process()
    before = {(c.pid, c.laddr) for c in listening_sockets({me.pid})}
    found = []

    def list_while_the_ranks_wait():
        try:
            deadline = time.monotonic() + 300
            while len(os.listdir(tmp_path)) < 2 and time.monotonic() < deadline:
                time.sleep(0.05)
            launch = {me.pid} | {p.pid for p in me.children(recursive=True)}
            found.extend(c for c in listening_sockets(launch) if (c.pid, c.laddr) not in before)
        finally:
            (tmp_path / "listed").touch()

    watcher = threading.Thread(target=list_while_the_ranks_wait)
    watcher.start()
    ports = rendezvous_then_wait.distributed(str(tmp_path))
    watcher.join()
    assert ports[0] in {c.laddr.port for c in found}, f"rank 0's rendezvous store was not among {found}"
    assert {c.laddr.ip for c in found} <= LOOPBACK, f"listening beyond loopback: {found}"


def test_a_plain_call_listens_on_loopback_only():
    @distributed
    def rendezvous_here():
        dist.init_process_group("gloo")
        listening = listening_sockets({os.getpid()})
        dist.destroy_process_group()
        return listening, int(os.environ["MASTER_PORT"])

    listening, port = rendezvous_here()
    assert port in {c.laddr.port for c in listening}
    assert {c.laddr.ip for c in listening} <= LOOPBACK, listening


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


THREADED_LAUNCHES = """
import pickle, sys, threading
from nbhelpers import distributed

class Point:  # defined in the script: plain pickle finds it through sys.modules["__main__"]
    def __init__(self, x):
        self.x = x

@distributed(gpus=1)
def make_point(x):
    return Point(x)

main_module, main_file = sys.modules["__main__"], __file__
errors = []

def launch_repeatedly(offset):
    try:
        for i in range(5):
            assert make_point.distributed(offset + i)[0].x == offset + i
    except BaseException as exc:
        errors.append(repr(exc))

threads = [threading.Thread(target=launch_repeatedly, args=(100 * t,)) for t in range(2)]
for t in threads:
    t.start()
for t in threads:
    t.join()
assert not errors, errors
assert sys.modules["__main__"] is main_module, "__main__ was left replaced"
assert sys.modules["__main__"].__file__ == main_file, "__main__.__file__ was left hidden"
assert pickle.loads(pickle.dumps(Point(3))).x == 3
print("the script's classes still pickle")
"""


def test_launches_from_two_threads_leave_the_scripts_classes_picklable(tmp_path):
    script = tmp_path / "two_threads.py"
    script.write_text(THREADED_LAUNCHES)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "the script's classes still pickle" in proc.stdout


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


def test_leftover_processes_sees_running_ranks(tmp_path):
    """Counted while both ranks are surely running: each says so with a file and waits for the count to be taken."""
    @distributed
    def count_while_running(folder):
        (folder / f"rank{os.environ['RANK']}").touch()
        deadline = time.monotonic() + 60
        while not (folder / "counted").exists() and time.monotonic() < deadline:
            time.sleep(0.05)

    def count():
        deadline = time.monotonic() + 60
        while not all((tmp_path / f"rank{r}").exists() for r in (0, 1)) and time.monotonic() < deadline:
            time.sleep(0.05)
        found.append(len(leftover_processes()))
        (tmp_path / "counted").touch()

    found = []
    watcher = threading.Thread(target=count)
    watcher.start()
    count_while_running.distributed(tmp_path)
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
    with pytest.raises(DistributedError, match="rank 1 of 2 failed") as caught:
        distributed(_fails_on_rank_1).distributed()
    assert_nothing_left_running()
    assert_a_peer_that_lost_its_connection_is_said_in_words(caught.value)


def assert_a_peer_that_lost_its_connection_is_said_in_words(err):
    """Rank 0, in a barrier when rank 1 raised, loses its connection: when its error arrived in time, the message says
    so in words, and gloo's raw text (its source path, "GLHF!" and an emoji) is only in err.later_failures."""
    message = str(err).split("Traceback from rank 1")[0]
    assert not re.search(r"pair\.cc|GLHF|Connection (closed|reset)|[^\x00-\x7f]", message), message
    if 0 in err.later_failures:
        assert re.search(r"Connection (closed|reset) by peer", err.later_failures[0]), err.later_failures
        assert "Rank 0 was waiting in a collective for rank 1" in message and "err.later_failures[0]" in message


def test_a_peers_lost_connection_is_said_in_words_and_another_later_error_is_quoted():
    from nbhelpers.launch.errors import later_failures_text

    gloo = ("RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:545] Read error "
            "[127.0.0.1]:15284: Connection reset by peer. This is typically caused by a remote worker crashing. GLHF! \U0001f3d6")
    nccl = "torch.distributed.DistBackendError: NCCL error: remote process exited or there was a network error"
    text = later_failures_text(1, {0: gloo, 2: nccl, 3: "ValueError: a bug of its own\nmore"})
    assert text == (
        "Rank 0 was waiting in a collective for rank 1, lost its connection when rank 1 failed, and was stopped: a "
        "consequence, not a failure of its own (its raw error: err.later_failures[0]).\n"
        "Rank 2 was waiting in a collective for rank 1, lost its connection when rank 1 failed, and was stopped: a "
        "consequence, not a failure of its own (its raw error: err.later_failures[2]).\n"
        "Rank 3 failed after it: ValueError: a bug of its own\n")


def test_processes_a_rank_started_in_their_own_session_are_stopped_too(capsys):
    @distributed
    def spawns_then_fails():
        child = subprocess.Popen(["sleep", "300"], start_new_session=True)
        print(f"child {child.pid}", flush=True)
        if int(os.environ["RANK"]) == 1:
            time.sleep(0.5)
            raise RuntimeError(f"child {child.pid} is running")
        time.sleep(300)

    with pytest.raises(DistributedError, match="rank 1"):
        spawns_then_fails.distributed()
    assert_nothing_left_running()
    # These two children by their pids: another test's `sleep 300`, running beside this one, is not theirs
    children = [int(pid) for pid in re.findall(r"^\[rank \d\] child (\d+)$", capsys.readouterr().out, re.MULTILINE)]
    assert len(children) == 2, children
    left = []
    for pid in children:
        with contextlib.suppress(psutil.NoSuchProcess):
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:  # a zombie has ended, awaiting its reaper
                left.append(pid)
    assert not left, f"left running: {left}"


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


def _dies_in_a_collective(how, late_report=False):
    dist.init_process_group("gloo")
    dist.barrier()
    if dist.get_rank() == 1:
        time.sleep(0.2)  # rank 0 waits in all_reduce by now
        if late_report:  # its end is seen late: its pipes outlive it, and the fork server reports its exit late
            pipes = []
            for fd in os.listdir("/proc/self/fd"):  # (the listing's own descriptor is gone by now)
                with contextlib.suppress(FileNotFoundError):
                    if os.readlink(f"/proc/self/fd/{fd}").startswith("pipe:"):
                        pipes.append(int(fd))
            subprocess.Popen(["sleep", "3"], pass_fds=pipes)  # as a DataLoader worker holds them (not the sockets)
            os.kill(os.getppid(), signal.SIGSTOP)  # its parent, the fork server: the test resumes it 2 s later
        if how == "SIGKILL":
            os.kill(os.getpid(), signal.SIGKILL)
        os._exit(0 if how == "exit 0" else 7)
    dist.all_reduce(torch.ones(1))  # fails with "Connection closed by peer" once rank 1 is gone
    time.sleep(300)


def assert_the_rank_that_died_is_blamed(err, how):
    assert err.rank == 1, str(err)
    if how == "SIGKILL":
        assert (err.signal_name, err.exitcode) == ("SIGKILL", -9), str(err)
    else:
        code = 0 if how == "exit 0" else 7
        assert err.exitcode == code and str(err).startswith(f"rank 1 of 2 exited with code {code} without returning")


@pytest.fixture(scope="module")
def busy_neighbours():
    """Three processes that spin beside the launches, as CI's other test workers load its 2 cores. Not children of this
    process (a subshell starts each and exits), so that the launches' "nothing left running" checks do not see them."""
    tag = f"busy-neighbour-of-{os.getpid()}"
    subprocess.run(["sh", "-c", 'for i in 1 2 3; do ("$0" -c "while True: pass" "$1" &); done', sys.executable, tag],
                   check=True)
    yield
    for spinner in psutil.process_iter(["cmdline"]):
        if tag in (spinner.info["cmdline"] or []):
            spinner.kill()


@pytest.mark.parametrize("attempt", range(10))
@pytest.mark.parametrize("how", ["SIGKILL", "os._exit", "exit 0"])
def test_the_rank_that_died_is_blamed_not_the_peer_whose_collective_broke(busy_neighbours, how, attempt):
    with pytest.raises(DistributedError) as caught:
        distributed(_dies_in_a_collective).distributed(how)
    assert_the_rank_that_died_is_blamed(caught.value, how)
    assert_nothing_left_running()


@pytest.mark.parametrize("how", ["SIGKILL", "exit 0"])
def test_the_rank_that_died_is_blamed_when_its_end_is_seen_after_the_peers_error(how):
    """Rank 1's end is seen late (a child holds its pipes open, and the fork server, which reports its exit status,
    is stopped for 2 s, as a loaded machine may leave it unscheduled), so rank 0's broken collective is read first:
    rank 1 is still the one named."""
    resumed = threading.Event()

    def resume_the_fork_server():
        while not resumed.is_set():
            for child in psutil.Process().children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    if child.status() == psutil.STATUS_STOPPED:
                        time.sleep(2)
                        child.resume()
                        resumed.set()
            time.sleep(0.01)

    watcher = threading.Thread(target=resume_the_fork_server, daemon=True)
    watcher.start()
    try:
        with pytest.raises(DistributedError) as caught:
            distributed(_dies_in_a_collective).distributed(how, late_report=True)
    finally:
        resumed.wait(10)
        resumed.set()
    assert_the_rank_that_died_is_blamed(caught.value, how)
    assert_nothing_left_running()


def test_a_ranks_traceback_shows_the_lines_of_code_that_exists_only_in_this_process():
    cell = "def parse(text):\n    return int(text)  # the line a reader must see\n"
    filename = "/nonexistent/ipykernel_0/cell.py"  # as a notebook cell: no file, its lines live in linecache
    linecache.cache[filename] = (len(cell), None, cell.splitlines(True), filename)
    namespace = {}
    exec(compile(cell, filename, "exec"), namespace)
    parse = namespace["parse"]

    @distributed
    def parse_on_every_rank():
        return parse("not a number" if os.environ["RANK"] == "1" else "1")

    try:
        with pytest.raises(DistributedError) as caught:
            parse_on_every_rank.distributed()
    finally:
        del linecache.cache[filename]
    assert (f'File "{filename}", line 2, in parse\n    return int(text)  # the line a reader must see'
            in caught.value.remote_traceback)


DOUBLE_INTERRUPTS = """
import faulthandler, signal, sys, time
faulthandler.register(signal.SIGUSR2, all_threads=True)  # the test's watchdog asks for the stacks of a stuck launch
# Ctrl-C raises KeyboardInterrupt here, as in a kernel, even where the tests were started with SIGINT ignored (a
# non-interactive shell's `make test &` ignores it for the whole run, and every process inherits that).
signal.signal(signal.SIGINT, signal.default_int_handler)
import nbhelpers
import nbhelpers.launch.local_engine as local_engine
from nbhelpers import distributed

local_engine.TERMINATE_GRACE_S = 1.0  # the second interrupt (after 0.5 s) arrives while the stop waits on SIGTERM

@distributed
def stubborn():
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # busy in C code, or a handler of its own: only SIGKILL ends it
    print("running", flush=True)
    time.sleep(300)

kept = []  # each traceback, and with it the launch's objects, stays alive: as a notebook's sys.last_traceback
for attempt in range(int(sys.argv[1])):
    try:
        stubborn.distributed()
    except KeyboardInterrupt as exc:
        kept.append(exc)
    print(f"attempt {attempt} ended", flush=True)
    sys.stdin.readline()
"""


def _dump_stacks_then_kill(proc):
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGUSR2)
        time.sleep(2)
        proc.kill()


def test_a_second_interrupt_during_the_stop_leaves_no_rank_running(tmp_path):
    attempts = 20
    script = tmp_path / "double_interrupts.py"
    script.write_text(DOUBLE_INTERRUPTS)
    proc = subprocess.Popen([sys.executable, str(script), str(attempts)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, bufsize=1)
    try:
        for attempt in range(attempts):
            # A launch stuck in an attempt (seen twice under CI's load, 2026-12-05, cause not found yet): its stacks
            # go to stderr and the script is ended, so the test fails in 90 s with them instead of hanging
            watchdog = threading.Timer(90, _dump_stacks_then_kill, args=(proc,))
            watchdog.start()
            running = 0
            while running < 2:
                line = proc.stdout.readline()
                assert line, f"the script ended in attempt {attempt} with code {proc.wait()}"
                running += line.endswith("] running\n")
            proc.send_signal(signal.SIGINT)
            time.sleep(0.5)
            proc.send_signal(signal.SIGINT)
            while (line := proc.stdout.readline()) != f"attempt {attempt} ended\n":
                assert line, (f"the script ended in attempt {attempt} with code {proc.wait()} (killed by the watchdog "
                              "if it was stuck: its stacks are in the captured stderr)")
            watchdog.cancel()
            assert_nothing_left_running(proc.pid)
            proc.stdin.write("\n")
        proc.stdin.close()
        proc.wait(timeout=120)  # a clean exit: the script's fork server and its temporary folder go too
    finally:
        proc.kill()
        proc.wait()


def test_an_interrupt_arriving_as_the_stop_starts_ignoring_them_leaves_the_handler_as_it_was(monkeypatch):
    """A SIGINT that arrives while the stop sets SIGINT to be ignored is raised right after that call returns: the
    handler must still be put back, or the process (a notebook's kernel) ignores every later interrupt, and so does
    every process it starts."""
    set_handler = signal.signal

    def set_then_interrupted(signum, handler):
        previous = set_handler(signum, handler)
        if handler is signal.SIG_IGN:
            raise KeyboardInterrupt  # the pending interrupt, raised at the next bytecode
        return previous

    inherited = set_handler(signal.SIGINT, signal.default_int_handler)  # a kernel's, whatever this process inherited
    try:
        monkeypatch.setattr(signal, "signal", set_then_interrupted)
        with pytest.raises(KeyboardInterrupt):
            with processes._interrupts_ignored():
                pass
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        set_handler(signal.SIGINT, inherited)


class _InterruptOnSecondEntry:
    """A stand-in for _main_module_not_rerun whose second entry (rank 1's start) is interrupted."""

    def __init__(self):
        self.entries = 0

    @contextlib.contextmanager
    def __call__(self):
        self.entries += 1
        if self.entries == 2:
            raise KeyboardInterrupt
        yield


def _interrupt(*args, **kwargs):
    raise KeyboardInterrupt


@pytest.mark.parametrize("where", ["picking the port", "starting rank 1", "starting the system-metrics sampler"])
def test_an_interrupt_during_the_start_is_a_keyboard_interrupt_and_leaves_nothing_running(monkeypatch, where):
    if where == "picking the port":
        monkeypatch.setattr(local_engine, "free_port", _interrupt)
    elif where == "starting rank 1":
        monkeypatch.setattr(fork_server, "_main_module_not_rerun", _InterruptOnSecondEntry())
    else:
        monkeypatch.setattr(local_engine.RankSampler, "start", _interrupt)
    with pytest.raises(KeyboardInterrupt):
        distributed(_sleeps).distributed(300)
    assert_nothing_left_running()


def test_a_stall_dumps_every_ranks_python_stack_then_kills_them():
    assert_a_stall_names_every_ranks_stack(2)
    assert_nothing_left_running()


# STALL_REPEATS=20 runs it 20 times in a row (issue 30 asks for 20 clean runs; CI runs it once)
@pytest.mark.parametrize("attempt", range(int(os.environ.get("STALL_REPEATS", "1"))))
def test_a_rank_stuck_in_a_collective_is_a_stall_while_another_rank_keeps_printing(attempt):
    assert_a_rank_stuck_in_a_collective_is_a_stall(4, reported_within=4 + 5)
    assert_nothing_left_running()


def _rank_1_works_silently_through_three_steps(seconds):
    def load():
        time.sleep(0.3)

    def forward():
        time.sleep(0.3)

    def backward():
        time.sleep(0.3)

    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if os.environ["RANK"] == "0":
            print("rank 0 reports for both", flush=True)
            time.sleep(0.5)
        else:
            load(), forward(), backward()
    return int(os.environ["RANK"])


def test_ranks_silent_by_design_are_not_stalled_while_their_stacks_move(capsys):
    silent = distributed(stall_timeout=2, output="rank0")(_rank_1_works_silently_through_three_steps)
    assert silent.distributed(8) == [0, 1]  # 4 stall timeouts of silence from rank 1
    assert "[rank 1]" not in capsys.readouterr().out
    assert_nothing_left_running()


def test_a_launch_writes_no_file_or_folder_into_the_temporary_directory(monkeypatch):
    tmp_path = Path(tempfile.mkdtemp(prefix="nbh-", dir="/tmp"))  # short, as a real TMPDIR
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", None)  # re-read TMPDIR
    assert distributed(_rank).distributed() == [0, 1]
    with pytest.raises(DistributedError):
        distributed(_fails_on_rank_1).distributed()
    with pytest.raises(DistributedError):
        distributed(stall_timeout=1)(_sleeps).distributed(30)
    left = [p.name for p in tmp_path.iterdir()]
    tmp_path.rmdir() if not left else None
    assert left == []


SIGKILLED_DRIVER = """
import sys, time
from nbhelpers import distributed

def sleeps():
    print("rank started", flush=True)
    time.sleep(300)

distributed(stall_timeout=60)(sleeps).distributed()
"""


def test_a_sigkilled_driver_leaves_no_rank_and_no_file_behind():
    tmp_path = Path(tempfile.mkdtemp(prefix="nbh-", dir="/tmp"))  # short: the fork server's socket path must fit
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    driver = subprocess.Popen([sys.executable, "-c", SIGKILLED_DRIVER], env=env, stdout=subprocess.PIPE, text=True)
    try:
        started = 0
        while started < 2:
            assert "rank started" in driver.stdout.readline(), "the driver ended before its ranks started"
            started += 1
        ranks = [p for p in psutil.Process(driver.pid).children(recursive=True)
                 if "sleeps" in " ".join(p.cmdline()) or p.ppid() != driver.pid]
    finally:
        driver.kill()
        driver.wait()
    assert len(ranks) == 2, ranks
    _, alive = psutil.wait_procs(ranks, timeout=10)
    assert not alive, f"ranks outlived their driver: {alive}"
    left = [p for p in tmp_path.rglob("nbhelpers-*")]
    shutil.rmtree(tmp_path, ignore_errors=True)
    assert not left, left


LAUNCHES_THEN_WAITS = """
import time
from nbhelpers import distributed

def rank():
    import os
    return int(os.environ["RANK"])

print(distributed(rank).distributed(), flush=True)
time.sleep(300)
"""


@pytest.mark.parametrize("killed", ["the driver", "its process group"])  # a Jupyter restart kills the kernel's group
def test_a_sigkilled_driver_leaves_no_multiprocessing_folder_in_the_temporary_directory(killed):
    tmp_path = Path(tempfile.mkdtemp(prefix="nbh-", dir="/tmp"))  # short: the fork server's socket path must fit
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    driver = subprocess.Popen([sys.executable, "-c", LAUNCHES_THEN_WAITS], env=env, stdout=subprocess.PIPE, text=True,
                              start_new_session=True)
    helpers = []
    try:
        assert driver.stdout.readline() == "[0, 1]\n", "the launch failed"
        helpers = psutil.Process(driver.pid).children(recursive=True)  # the fork server, multiprocessing's tracker
        assert list(tmp_path.glob("pymp-*")), "the fork server's socket is no longer in multiprocessing's folder"
    finally:
        os.killpg(driver.pid, signal.SIGKILL) if killed == "its process group" else driver.kill()
        driver.wait()
    _, alive = psutil.wait_procs(helpers, timeout=10)
    left = [p.name for p in tmp_path.iterdir()]
    shutil.rmtree(tmp_path, ignore_errors=True)
    assert not alive, f"outlived their driver: {alive}"
    assert left == []


def _rank():
    return int(os.environ["RANK"])


def _sleeps(seconds):
    time.sleep(seconds)


def _returns_an_object_of_a_module_only_the_rank_has(folder):
    sys.path.insert(0, folder)
    import only_in_rank

    return only_in_rank.Result(int(os.environ["RANK"]))


def test_a_return_value_this_process_cannot_load_names_the_rank_and_what_to_return(tmp_path):
    (tmp_path / "only_in_rank.py").write_text("class Result:\n    def __init__(self, rank):\n        self.rank = rank\n")
    with pytest.raises(DistributedError) as caught:
        distributed(_returns_an_object_of_a_module_only_the_rank_has).distributed(str(tmp_path))
    message = str(caught.value)
    assert caught.value.rank in (0, 1)
    assert message.startswith(f"rank {caught.value.rank} of 2 returned from _returns_an_object_of_a_module_only_the_"
                              "rank_has(), but its return value cannot be loaded in this process: ModuleNotFoundError: "
                              "No module named 'only_in_rank'"), message
    assert "Return plain types (numbers, strings, lists, dicts, tensors), or define the class in a module" in message
    assert "only_in_rank" not in sys.modules
    assert_nothing_left_running()


# --- serverless_gpu's signature, runs in the background, GPU leases, system metrics (issue 19) -------

def test_a_gpu_type_other_than_the_visible_gpus_is_refused_at_decoration(monkeypatch, tmp_path):
    simulate_gpus(monkeypatch, tmp_path, 2)
    with pytest.raises(ValueError, match=r"gpu_type='A10' but the GPUs visible here are NVIDIA H200 \(2x\)"):
        distributed(gpus=2, gpu_type="A10")(lambda: None)
    with pytest.raises(ValueError, match="gpu_type='H100'"):
        distributed(gpu_type="H100")(lambda: None)
    distributed(gpus=2, gpu_type="h200")(lambda: None)  # the name as the GPU's product name has it, any case
    assert not leftover_processes()


def test_remote_without_a_ray_cluster_is_refused_at_once_with_what_to_do():
    code = "from nbhelpers import distributed\ndistributed(gpus=2, gpu_type='A10', remote=True)(print)"
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode != 0
    assert "attached to none" in proc.stderr and 'ray.init(address="HEAD_IP:6379") (or set RAY_ADDRESS)' in proc.stderr
    with pytest.raises(ValueError, match='remote=True runs on a Ray cluster'):
        distributed(remote=True, engine="local")(print)


def _meet(folder, count):
    """Say this rank has started (its CUDA_VISIBLE_DEVICES), then wait until `count` ranks have."""
    gpu = os.environ.get("CUDA_VISIBLE_DEVICES")
    open(os.path.join(folder, f"started-{gpu}"), "w").close()
    deadline = time.monotonic() + 120
    while len([f for f in os.listdir(folder) if f.startswith("started-")]) < count:
        assert time.monotonic() < deadline, "the other run never started: the runs did not overlap"
        time.sleep(0.05)
    return gpu


def test_two_runs_in_the_background_run_at_once_on_different_gpus(monkeypatch, tmp_path):
    simulate_gpus(monkeypatch, tmp_path, 2)
    meet = distributed(gpus=1)(_meet)
    runs = [meet.distributed_async(str(tmp_path), 2) for _ in range(2)]
    gpus = [run.result(timeout=300)[0] for run in runs]
    assert sorted(gpus) == ["0", "1"]
    assert_nothing_left_running()


def _hold_until_released(folder, name):
    open(os.path.join(folder, f"{name}-{os.getpid()}"), "w").close()
    while not os.path.exists(os.path.join(folder, "release")):
        time.sleep(0.05)
    return os.environ.get("CUDA_VISIBLE_DEVICES")


def wait_for_file(folder, prefix):
    deadline = time.monotonic() + 300
    while not (found := [f for f in os.listdir(folder) if f.startswith(prefix)]):
        assert time.monotonic() < deadline, f"no {prefix}* in {folder}"
        time.sleep(0.05)
    return int(found[0].rsplit("-", 1)[1])


def test_a_launch_waits_for_the_gpu_another_launch_holds(monkeypatch, tmp_path, capsys):
    simulate_gpus(monkeypatch, tmp_path, 1)
    hold = distributed(gpus=1)(_hold_until_released)
    first = hold.distributed_async(str(tmp_path), "first")
    wait_for_file(tmp_path, "first-")
    second = hold.distributed_async(str(tmp_path), "second")
    deadline = time.monotonic() + 60
    while "waiting for 1 GPU(s)" not in capsys.readouterr().err:
        assert time.monotonic() < deadline, "the second launch did not say that it waits"
        time.sleep(0.05)
    assert not second.done() and not [f for f in os.listdir(tmp_path) if f.startswith("second-")]
    (tmp_path / "release").touch()
    assert first.result(timeout=300) == ["0"] and second.result(timeout=300) == ["0"]
    assert_nothing_left_running()


HOLDS_GPU_0 = """
import sys, time
from nbhelpers.launch.gpu_lease import GpuLease
with GpuLease(["0", "1"], 1, holder="another notebook") as gpus:
    print("holding", gpus, flush=True)
    time.sleep(300)
"""


def test_the_gpu_lease_is_seen_by_every_process_of_the_host(monkeypatch, tmp_path):
    simulate_gpus(monkeypatch, tmp_path, 2)
    other = subprocess.Popen([sys.executable, "-c", HOLDS_GPU_0], stdout=subprocess.PIPE, text=True)
    try:
        assert other.stdout.readline() == "holding ['0']\n"

        @distributed(gpus=1)
        def gpu():
            return os.environ["CUDA_VISIBLE_DEVICES"]

        assert gpu.distributed() == ["1"]
    finally:
        other.kill()
        other.wait()


def _lease_gpu_0_as_nobody() -> str:
    """What happens when user nobody leases GPU 0, in a fork of this process (only plain system calls in it)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            with GpuLease(["0"], 1, holder="another user") as gpus:
                outcome = f"leased {gpus}"
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            outcome = repr(exc)
        os.write(write, outcome.encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        outcome = f.read()
    os.waitpid(pid, 0)
    return outcome


def test_a_gpu_lease_file_can_be_locked_by_another_user_of_the_host(monkeypatch):
    folder = Path(tempfile.mkdtemp(prefix="nbh-", dir="/tmp"))
    folder.chmod(0o755)  # every user may enter it, as /tmp
    monkeypatch.setenv("NBHELPERS_GPU_LEASE_DIR", str(folder / "leases"))
    umask = os.umask(0o022)  # the usual one
    try:
        with GpuLease(["0"], 1, holder="the first user"):
            pass
        assert (folder / "leases" / "gpu-0.lock").stat().st_mode & 0o777 == 0o666
        if os.geteuid() == 0:  # root can be another user
            assert _lease_gpu_0_as_nobody() == "leased ['0']"
    finally:
        os.umask(umask)
        shutil.rmtree(folder)


def test_cancelling_one_run_stops_its_ranks_and_nothing_else(monkeypatch, tmp_path):
    simulate_gpus(monkeypatch, tmp_path, 2)
    hold = distributed(gpus=1)(_hold_until_released)
    cancelled, kept = hold.distributed_async(str(tmp_path), "cancelled"), hold.distributed_async(str(tmp_path), "kept")
    cancelled_pid, kept_pid = wait_for_file(tmp_path, "cancelled-"), wait_for_file(tmp_path, "kept-")
    assert cancelled.cancel()
    with pytest.raises(concurrent.futures.CancelledError):
        cancelled.result()
    assert not psutil.pid_exists(cancelled_pid) or psutil.Process(cancelled_pid).status() == psutil.STATUS_ZOMBIE
    assert kept.running() and psutil.Process(kept_pid).status() != psutil.STATUS_ZOMBIE
    (tmp_path / "release").touch()
    assert kept.result(timeout=300) in (["0"], ["1"])
    assert_nothing_left_running()


def test_output_of_a_run_in_the_background_names_the_run_and_the_rank(monkeypatch):
    stream = TimedStream()
    monkeypatch.setattr(sys, "stdout", stream)

    @distributed
    def talk():
        print("hello")

    run = talk.distributed_async()
    run.result(timeout=300)
    assert f"[{run.name} rank 0] hello\n" in stream.text() and f"[{run.name} rank 1] hello\n" in stream.text()


def _busy(seconds):
    started = time.monotonic()
    while time.monotonic() - started < seconds:
        sum(range(10_000))


# A rank that spins for 3 s keeps about one core busy (100 %; its first sample only starts psutil's measurement,
# about 0), less while the machine's other test streams share its cores: its samples' mean was 42 % and their largest
# near 100 on an idle 2-core machine. A sampler that never measured (0), or measured in another unit (a fraction of 1:
# 0.42), lies outside these bounds.
BUSY_CPU_MEAN_PERCENT, BUSY_CPU_MAX_PERCENT = 10, 25
CPU_PERCENT_CEILING = 100 * os.cpu_count() + 10


def test_a_launch_returns_its_ranks_system_metrics():
    results = distributed(_busy).distributed(3)
    metrics = results.system_metrics
    assert all(n >= 2 for n in metrics["samples_per_rank"]), metrics
    assert all(BUSY_CPU_MEAN_PERCENT < cpu <= CPU_PERCENT_CEILING for cpu in metrics["cpu_utilization_percent_mean"]), (
        metrics)
    assert all(memory > 10 * 2**20 for memory in metrics["host_memory_peak_bytes"]), metrics
    assert metrics["gpu_utilization_percent_mean"] is None and metrics["gpu_memory_peak_bytes"] is None  # no GPU


def test_a_rank_that_has_exited_but_is_not_reaped_yet_gives_no_0_mb_sample():
    """Seen in CI (2026-12-06): a rank's last MLflow sample read 0 MB, taken between its exit and its reaping."""
    rank = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        deadline = time.monotonic() + 60
        while psutil.Process(rank.pid).status() != psutil.STATUS_ZOMBIE:  # exited, not reaped (no wait() yet)
            assert time.monotonic() < deadline, "the process did not exit"
            time.sleep(0.05)
        sampler = local_engine.RankSampler([rank.pid], gpus=[None])
        sampler.start()
        metrics = sampler.stop()
        assert metrics["samples_per_rank"] == [0] and metrics["host_memory_peak_bytes"] == [None], metrics
    finally:
        rank.wait()


@pytest.fixture(scope="module")
def mlflow_store(tmp_path_factory):
    """An MLflow store for this module's tests, its tables made once (that takes seconds)."""
    import mlflow

    uri = f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"
    mlflow.MlflowClient(tracking_uri=uri).search_experiments()
    return uri


def test_mlflow_info_lines_are_quiet_in_the_ranks_and_its_warnings_stay(capfd, monkeypatch):
    # MLflow logs routine INFO lines (creating tables, monitoring system metrics) to stderr: in a notebook an error's colour
    monkeypatch.delenv("MLFLOW_LOGGING_LEVEL", raising=False)

    @distributed(gpus=1)
    def logs_like_mlflow():
        import logging

        import mlflow  # noqa: F401  (it sets up its loggers as it is imported)

        logging.getLogger("mlflow.store.db.utils").info("Creating initial MLflow database tables...")
        logging.getLogger("mlflow.tracking").warning("a warning of MLflow")
        logging.getLogger("mlflow.tracking").error("an error of MLflow")

    logs_like_mlflow.distributed()
    err = capfd.readouterr().err
    assert "a warning of MLflow" in err and "an error of MLflow" in err, err
    assert "Creating initial MLflow database tables" not in err, err


def test_system_metrics_arrive_in_the_active_mlflow_run(mlflow_store, tmp_path):
    import mlflow

    mlflow.set_tracking_uri(mlflow_store)
    try:  # the run's artifacts (the ranks' logs) in tmp_path: a store's default is ./mlruns, the repository here
        experiment = mlflow.create_experiment(f"system-metrics-{tmp_path.name}", artifact_location=tmp_path.as_uri())
        with mlflow.start_run(experiment_id=experiment) as run:
            distributed(_busy).distributed(3)
        client = mlflow.tracking.MlflowClient()
        for rank in (0, 1):
            cpu = client.get_metric_history(run.info.run_id, f"system/rank_{rank}_cpu_utilization_percentage")
            memory = client.get_metric_history(run.info.run_id, f"system/rank_{rank}_memory_usage_megabytes")
            assert len(cpu) >= 2 and BUSY_CPU_MAX_PERCENT < max(m.value for m in cpu), cpu
            assert all(0 <= m.value <= CPU_PERCENT_CEILING for m in cpu), cpu
            assert memory and all(m.value > 10 for m in memory), memory
    finally:
        mlflow.set_tracking_uri(None)


# --- a real Jupyter kernel, one for these tests; they come last: it lives until the module ends ---------

KERNEL_LAUNCH = """
import faulthandler, os, signal, time
from nbhelpers import distributed

# for a test that waits in vain: SIGUSR2 writes every thread's stack here (reply_after_interrupt)
faulthandler.register(signal.SIGUSR2, file=open(os.environ["KERNEL_STACKS_FILE"], "w"), all_threads=True)

@distributed
def tracks_then_sleeps(tracking_uri):
    if os.environ["RANK"] == "0":  # as a notebook's training function: rank 0 opens an MLflow run
        import mlflow

        mlflow.set_tracking_uri(tracking_uri)
        print("mlflow run", mlflow.start_run().info.run_id, flush=True)
    print("ranks are running", flush=True)
    time.sleep(300)

@distributed
def stubborn():
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # only SIGKILL ends it: the stop takes TERMINATE_GRACE_S
    print("ranks are running", flush=True)
    time.sleep(300)

@distributed
def parse_on_every_rank():
    text = "not a number" if os.environ["RANK"] == "1" else "1"
    return int(text)  # the line a reader must see
"""


@pytest.fixture(scope="module")
def kernel(tmp_path_factory):
    """A real Jupyter kernel with KERNEL_LAUNCH run in a cell: (manager, client, that cell's number)."""
    from jupyter_client.manager import start_new_kernel

    stacks = tmp_path_factory.mktemp("kernel") / "stacks.txt"
    km, kc = start_new_kernel(kernel_name="python3", env={**os.environ, "KERNEL_STACKS_FILE": str(stacks)})
    km.stacks_file = stacks
    try:
        reply = kc.execute_interactive(KERNEL_LAUNCH, timeout=120, output_hook=lambda msg: None)
        assert reply["content"]["status"] == "ok", reply["content"]
        yield km, kc, reply["content"]["execution_count"]
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def start_and_wait_until_running(kc, code):
    """What the cell printed until both ranks run."""
    # stop_on_error=False: an interrupted cell would otherwise make the kernel abort the requests queued behind it,
    # and under load the next test's request can reach that queue before the kernel closes it (ipykernel 7)
    msg_id = kc.execute(code, stop_on_error=False)
    seen = ""
    deadline = time.monotonic() + 120
    while seen.count("ranks are running") < 2 and time.monotonic() < deadline:
        msg = kc.get_iopub_msg(timeout=120)
        if msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "stream":
            seen += msg["content"]["text"]
        assert not (msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "error"), msg["content"]
    assert "[rank 0] ranks are running" in seen and "[rank 1] ranks are running" in seen, seen
    return seen


def reply_after_interrupt(km, kc, timeout):
    """The interrupted cell's reply. Without one in time, the error says what the kernel was doing: its threads'
    stacks and its processes (a CI run once waited in vain here, and the kernel answered nothing after it)."""
    try:
        return kc.get_shell_msg(timeout=timeout)
    except queue.Empty:
        alive = km.is_alive()
        processes = []
        if alive:
            km.provisioner.process.send_signal(signal.SIGUSR2)
            time.sleep(1)
            with contextlib.suppress(psutil.Error):
                for p in psutil.Process(km.provisioner.process.pid).children(recursive=True):
                    with contextlib.suppress(psutil.Error):
                        processes.append((p.pid, p.status(), " ".join(p.cmdline())[:100]))
        stacks = km.stacks_file.read_text() if km.stacks_file.exists() else ""
        raise AssertionError(f"no reply {timeout} s after the interrupt; kernel alive: {alive}; its processes: "
                             f"{processes}; its stacks:\n{stacks}") from None


def test_interrupting_the_kernel_stops_every_rank_says_so_in_one_line_and_ends_the_mlflow_run_killed(kernel, mlflow_store):
    import mlflow

    km, kc, _ = kernel
    seen = start_and_wait_until_running(kc, f"tracks_then_sleeps.distributed({mlflow_store!r})")
    run_id = re.search(r"\[rank 0\] mlflow run (\w+)", seen).group(1)
    kernel_pid = km.provisioner.process.pid
    assert len(leftover_processes(kernel_pid)) >= 2
    km.interrupt_kernel()
    reply = reply_after_interrupt(km, kc, timeout=30)
    assert reply["content"]["status"] == "error"
    assert reply["content"]["ename"] == "KeyboardInterrupt"
    assert_nothing_left_running(kernel_pid)
    # what the cell shows: one line saying what happened, none of the launcher's frames
    assert re.fullmatch(r"stopped 2 ranks of tracks_then_sleeps\(\) after \d+\.\d s", reply["content"]["evalue"])
    shown = re.sub(r"\x1b\[[0-9;]*m", "", "\n".join(reply["content"]["traceback"]))
    assert shown == f"KeyboardInterrupt: {reply['content']['evalue']}", shown
    assert mlflow.MlflowClient(tracking_uri=mlflow_store).get_run(run_id).info.status == "KILLED"


def test_interrupting_the_kernel_twice_leaves_no_rank_running(kernel):
    km, kc, _ = kernel
    kernel_pid = km.provisioner.process.pid
    for attempt in range(3):  # the kernel keeps each traceback (sys.last_traceback), and the launch's objects
        start_and_wait_until_running(kc, "stubborn.distributed()")
        km.interrupt_kernel()
        time.sleep(0.5)
        km.interrupt_kernel()
        reply = reply_after_interrupt(km, kc, timeout=60)
        assert reply["content"]["ename"] == "KeyboardInterrupt", reply["content"]
        assert_nothing_left_running(kernel_pid)


def test_a_ranks_traceback_in_a_notebook_names_the_cell_and_shows_its_line(kernel):
    km, kc, launch_cell = kernel
    reply = kc.execute_interactive("parse_on_every_rank.distributed()", timeout=120, output_hook=lambda msg: None,
                                   stop_on_error=False)
    content = reply["content"]
    assert content["ename"] == "DistributedError"
    source_line = "    return int(text)  # the line a reader must see"
    number = KERNEL_LAUNCH.strip().splitlines().index(source_line) + 1  # IPython drops the cell's leading blank line
    assert f"Cell In[{launch_cell}], line {number}, in parse_on_every_rank\n{source_line}" in content["evalue"]


def test_the_rendezvous_port_is_free_and_outside_the_range_the_kernel_hands_out():
    # a port from bind(0) can be handed to someone else (gloo's pairs, another run) before rank 0 binds it
    from nbhelpers.launch.processes import free_port

    with open("/proc/sys/net/ipv4/ip_local_port_range") as ranges:
        ephemeral_low = int(ranges.read().split()[0])
    ports = {free_port() for _ in range(20)}
    assert all(20000 <= port < ephemeral_low for port in ports) and len(ports) > 1
    for port in ports:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))
