"""Ray: `@distributed(engine="ray")` across the nodes of a Ray cluster (the Ray Train recipes: test_ray_recipes.py).

Everything here shares one 2-node Ray cluster on 127.0.0.1 with one CPU per node (tests/ray_cluster.py:
loopback only, telemetry and cloud probing off), started once for this module and stopped after it, so
two ranks always land on two different nodes.
"""
import concurrent.futures
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil
import pytest
import ray
import torch
import torch.distributed as dist
from ray_cluster import connect, start_loopback_cluster, stop_loopback_cluster
from launcher_checks import assert_a_rank_stuck_in_a_collective_is_a_stall, assert_a_stall_names_every_ranks_stack
from timed_stream import TimedStream

from nbhelpers import DistributedError, distributed
from nbhelpers.launch import ray_engine
from nbhelpers.launch.ray_engine import rank_layout

TORCHRUN_KEYS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT")


@pytest.fixture(scope="module", autouse=True)
def ray_cluster():
    """The module's cluster; this process is its driver. Yields the environment for subprocesses."""
    cluster, env = start_loopback_cluster(nodes=2, cpus_per_node=1)
    try:
        connect(cluster)
        yield env
    finally:
        stop_loopback_cluster(cluster)


# --- @distributed(engine="ray") ----------------------------------------------------------------

def leftovers():
    """What a launch could leave behind: live rank/outbox actors, placement groups, processes of a launch."""
    actors = [a["ActorClassName"] for a in ray._private.state.actors().values()  # GCS view; the state API needs a dashboard
              if a["State"] != "DEAD" and a["ActorClassName"] in ("_RankActor", "_Outbox")]
    groups = [g["name"] for g in ray.util.placement_group_table().values() if g["state"] != "REMOVED"]
    processes = []
    for p in psutil.process_iter():
        try:
            if p.environ().get("NBHELPERS_LAUNCH_ID", "").startswith("nbhelpers-ray-"):
                processes.append((p.pid, p.cmdline()))
        except psutil.Error:
            pass
    return actors, groups, processes


def assert_nothing_left():
    deadline = time.monotonic() + 15  # Ray kills and reaps asynchronously
    while any(left := leftovers()) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(left), f"left behind (actors, placement groups, processes): {left}"


def test_ranks_on_two_nodes_get_the_torchrun_environment_and_results_come_back_in_rank_order():
    @distributed(engine="ray")
    def where():
        dist.init_process_group("gloo")  # across the two nodes, through MASTER_ADDR:MASTER_PORT
        total = torch.tensor([dist.get_rank() + 1.0])
        dist.all_reduce(total)
        dist.destroy_process_group()
        rank = int(os.environ["RANK"])
        time.sleep(0.5 * (1 - rank))  # rank 1 finishes first
        return {**{k: os.environ[k] for k in TORCHRUN_KEYS}, "node": ray.get_runtime_context().get_node_id(),
                "sum": total.item(), "tensor": torch.full((2,), float(rank))}

    results = where.distributed()
    assert [r["RANK"] for r in results] == ["0", "1"]
    assert results[0]["node"] != results[1]["node"]
    assert [r["GROUP_RANK"] for r in results] == ["0", "1"]
    assert [(r["LOCAL_RANK"], r["LOCAL_WORLD_SIZE"]) for r in results] == [("0", "1"), ("0", "1")]
    assert {r["WORLD_SIZE"] for r in results} == {"2"}
    assert {r["MASTER_ADDR"] for r in results} == {"127.0.0.1"}
    assert len({r["MASTER_PORT"] for r in results}) == 1
    assert [r["sum"] for r in results] == [3.0, 3.0]
    assert [r["tensor"].tolist() for r in results] == [[0.0, 0.0], [1.0, 1.0]]
    assert_nothing_left()


def test_each_ranks_output_streams_live_into_the_cell_with_its_rank_as_prefix(monkeypatch):
    out, err = TimedStream(), TimedStream()
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr(sys, "stderr", err)

    @distributed(engine="ray")
    def talk():
        rank = os.environ["RANK"]
        print(f"starting on {rank}", flush=True)
        print(f"a warning from {rank}", file=sys.stderr, flush=True)
        subprocess.run(["echo", f"a subprocess of {rank}"], check=True)
        time.sleep(3)
        print("done")

    talk.distributed()
    returned = time.monotonic()
    text = out.text()
    for rank in (0, 1):
        assert f"[rank {rank}] starting on {rank}\n" in text
        assert f"[rank {rank}] a subprocess of {rank}\n" in text
        assert f"[rank {rank}] done\n" in text
        assert f"[rank {rank}] a warning from {rank}\n" in err.text()
    first = next(t for t, piece in out.pieces if "starting on" in piece)
    assert returned - first > 2, "output arrived only when the ranks finished, not while they ran"
    assert_nothing_left()


def test_a_failing_rank_raises_one_error_naming_it_and_nothing_is_left_on_any_node():
    @distributed(engine="ray")
    def fails_on_rank_1():
        if os.environ["RANK"] == "1":
            time.sleep(1)
            raise ValueError("no shard for rank 1")
        subprocess.Popen(["sleep", "3171"], start_new_session=True)  # escapes the rank's process group
        time.sleep(300)

    with pytest.raises(DistributedError) as caught:
        fails_on_rank_1.distributed()
    err = caught.value
    assert err.rank == 1
    assert str(err).startswith("rank 1 of 2 failed in fails_on_rank_1(): ValueError: no shard for rank 1")
    assert 'raise ValueError("no shard for rank 1")\nValueError: no shard for rank 1' in err.remote_traceback  # its own line
    assert_nothing_left()
    assert not [p for p in psutil.process_iter(["cmdline"]) if p.info["cmdline"] == ["sleep", "3171"]]


def test_a_rank_whose_process_dies_is_named_with_its_last_output():
    @distributed(engine="ray")
    def killed():
        if os.environ["RANK"] == "1":
            print("about to be killed", flush=True)
            time.sleep(0.5)
            os.kill(os.getpid(), 9)
        time.sleep(300)

    with pytest.raises(DistributedError) as caught:
        killed.distributed()
    err = caught.value
    assert err.rank == 1
    assert "rank 1 of 2 died without returning from killed()" in str(err)
    assert "[rank 1] about to be killed" in str(err)
    assert_nothing_left()


def test_a_rank_that_dies_in_a_collective_is_named_not_the_peer_whose_collective_broke():
    @distributed(engine="ray")
    def dies_in_a_collective():
        import torch.distributed as dist

        dist.init_process_group("gloo")
        dist.barrier()
        if dist.get_rank() == 1:
            time.sleep(0.2)  # rank 0 waits in all_reduce by now
            os._exit(0)
        dist.all_reduce(torch.ones(1))  # fails with "Connection closed by peer", and may be reported first
        time.sleep(300)

    with pytest.raises(DistributedError) as caught:
        dies_in_a_collective.distributed()
    err = caught.value
    assert err.rank == 1, str(err)
    assert "rank 1 of 2 died without returning from dies_in_a_collective()" in str(err)
    assert_nothing_left()


def test_a_stall_dumps_every_ranks_python_stack_then_kills_them_on_every_node():
    assert_a_stall_names_every_ranks_stack(6, engine="ray")
    assert_nothing_left()


def test_a_rank_too_slow_to_answer_after_a_stall_is_shown_by_the_stack_it_sent_while_silent(monkeypatch):
    monkeypatch.setattr(ray_engine, "STACK_WAIT_S", 0.0)  # no rank's answer to the stall is waited for
    assert_a_stall_names_every_ranks_stack(6, engine="ray")
    assert_nothing_left()


def test_a_rank_stuck_in_a_collective_is_a_stall_while_another_rank_keeps_printing():
    assert_a_rank_stuck_in_a_collective_is_a_stall(6, engine="ray")
    assert_nothing_left()


def test_a_ray_cluster_that_stops_answering_is_a_stall_too(monkeypatch):
    out = TimedStream()
    monkeypatch.setattr(sys, "stdout", out)

    @distributed(engine="ray", stall_timeout=6)
    def prints_for_ever():
        while True:
            print("still here", flush=True)
            time.sleep(0.5)

    frozen = []

    def freeze_the_outbox():  # the actor that carries the ranks' output to this process stops answering
        deadline = time.monotonic() + 120
        while "[rank 1] still here" not in out.text() and time.monotonic() < deadline:
            time.sleep(0.1)
        for p in psutil.process_iter(["cmdline"]):
            if "_Outbox" in " ".join(p.info["cmdline"] or []):
                p.suspend()
                frozen.append(p)

    freezer = threading.Thread(target=freeze_the_outbox)
    freezer.start()
    try:
        with pytest.raises(DistributedError, match="no rank of prints_for_ever"):
            prints_for_ever.distributed()
    finally:
        freezer.join()
        for p in frozen:
            with contextlib.suppress(psutil.Error):
                p.resume()
    assert frozen, "found no outbox process to freeze"
    assert_nothing_left()


def test_remote_true_runs_on_the_attached_ray_cluster(capsys):
    @distributed(gpus=2, gpu_type="H100", remote=True)  # as written for serverless_gpu
    def where():
        return os.environ["RANK"], ray.get_runtime_context().get_node_id()

    results = where.distributed()
    assert [rank for rank, _ in results] == ["0", "1"] and results[0][1] != results[1][1]
    assert "gpu_type='H100' ignored: the Ray cluster has no GPU" in capsys.readouterr().err
    assert_nothing_left()


RAY_LAUNCH_CELL = """
import ray
from serverless_gpu.ray import ray_launch

@ray.remote(num_cpus=1)  # schedule on a worker, not the head node
class TaskRunner:
    def run(self):
        return ray.get_runtime_context().get_node_id()

@ray_launch(gpus=2, gpu_type='A10', remote=True)
def read_uc_multinode():
    runner = TaskRunner.remote()
    return ray.get(runner.run.remote()), len(ray.nodes())

ds = read_uc_multinode.distributed()
"""


def test_a_ray_launch_cell_drives_the_attached_cluster_with_only_the_import_changed(capsys):
    namespace = {}
    cell = RAY_LAUNCH_CELL.replace("from serverless_gpu.ray import ray_launch", "from nbhelpers import ray_launch")
    exec(compile(cell, "<a serverless_gpu ray_launch cell>", "exec"), namespace)
    node_id, nodes = namespace["ds"]
    assert nodes == 2 and node_id in {n["NodeID"] for n in ray.nodes()}
    assert "the attached Ray cluster has no GPU, so gpus=2 and gpu_type='A10' are ignored" in capsys.readouterr().err
    assert_nothing_left()


LOCAL_RAY_LAUNCH = """
import ray
from nbhelpers import ray_launch

@ray_launch(gpus=1)
def count_nodes(x):
    @ray.remote
    def square(v):
        return v * v
    return ray.get(square.remote(x)), ray.cluster_resources()["CPU"]

print("result", count_nodes.distributed(7), ray.is_initialized())
"""


def test_ray_launch_without_remote_starts_a_ray_of_its_own_and_shuts_it_down(ray_cluster):
    scratch = Path(tempfile.mkdtemp(prefix="rayl-", dir="/tmp"))  # short: Ray's socket paths must fit 107 bytes
    (scratch / "ray_bootstrap_config.yaml").write_text("{}\n")  # no cloud metadata probes (tests/ray_cluster.py)
    env = {k: v for k, v in ray_cluster.items() if k != "RAY_ADDRESS"} | {"HOME": str(scratch), "RAY_TMPDIR": str(scratch)}
    try:
        proc = subprocess.run([sys.executable, "-c", LOCAL_RAY_LAUNCH], env=env, capture_output=True, text=True,
                              timeout=300)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "result (49, 1.0) False" in proc.stdout, proc.stdout + proc.stderr[-2000:]
    assert "@ray_launch: a Ray on this machine with 0 GPU(s), 1 CPU(s) for count_nodes()" in proc.stderr


def test_cancelling_a_ray_run_in_the_background_stops_its_ranks(monkeypatch):
    out = TimedStream()
    monkeypatch.setattr(sys, "stdout", out)

    @distributed(engine="ray")
    def runs_for_ever():
        print("running", flush=True)
        time.sleep(300)

    run = runs_for_ever.distributed_async()
    deadline = time.monotonic() + 120
    while out.text().count("running") < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert f"[{run.name} rank 1] running" in out.text()
    assert run.cancel()
    with pytest.raises(concurrent.futures.CancelledError):
        run.result()
    assert_nothing_left()


def test_more_ranks_than_the_cluster_holds_are_refused_before_anything_starts():
    groups_before = len(ray.util.placement_group_table())
    with pytest.raises(ValueError, match=r"the Ray cluster has no GPU, and 2 CPU\(s\) in all for 3 CPU ranks"):
        distributed(gpus=3, engine="ray")(lambda: None).distributed()
    assert len(ray.util.placement_group_table()) == groups_before


def test_an_unknown_engine_is_refused_at_decoration():
    with pytest.raises(ValueError, match=r"engine must be one of \('local', 'ray'\), got 'spark'"):
        distributed(engine="spark")(lambda: None)


def test_without_an_attached_ray_the_error_says_to_call_ray_init():
    code = "from nbhelpers import distributed\ndistributed(engine='ray')(print).distributed()"
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode != 0
    assert 'call ray.init(address="auto")' in proc.stderr


def test_ranks_are_numbered_node_by_node_and_local_rank_indexes_the_nodes_gpus():
    places = [  # as PACK placed 4 one-GPU bundles on two nodes of 2 GPUs (a GPU cluster, faked)
        {"node_id": "b", "ip": "10.0.0.2", "gpu_ids": ["3"]},
        {"node_id": "a", "ip": "10.0.0.1", "gpu_ids": ["1"]},
        {"node_id": "b", "ip": "10.0.0.2", "gpu_ids": ["2"]},
        {"node_id": "a", "ip": "10.0.0.1", "gpu_ids": ["0"]},
    ]
    layout = rank_layout(places, use_gpu=True)
    assert [i for i, _ in layout] == [2, 0, 3, 1]  # node b first (bundle 0 is there), then by GPU id
    assert [env["LOCAL_RANK"] for _, env in layout] == ["0", "1", "0", "1"]
    assert [env["GROUP_RANK"] for _, env in layout] == ["0", "0", "1", "1"]
    assert [env["CUDA_VISIBLE_DEVICES"] for _, env in layout] == ["2,3", "2,3", "0,1", "0,1"]
    assert {env["MASTER_ADDR"] for _, env in layout} == {"10.0.0.2"}
    assert {env["LOCAL_WORLD_SIZE"] for _, env in layout} == {"2"}


def test_the_test_cluster_listens_on_loopback_only():
    this = psutil.Process()  # the driver (this process) and the nodes' processes, all started from here
    ray_processes = {this.pid} | {p.pid for p in this.children(recursive=True)}
    listening = [c for c in psutil.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN and c.pid in ray_processes]
    assert listening, "found no listening Ray process to check"
    assert {c.laddr.ip for c in listening} <= {"127.0.0.1", "::ffff:127.0.0.1"}, listening
