"""Code from Databricks' documentation runs with only the import changed (issue 29): the AI Runtime SDK
(`databricks.air`, GPU environment 6 and later) and `serverless_gpu` (environment 5 and earlier).

Each cell below keeps the decorator, the arguments and the call of a documented example; where the example's
body binds a CUDA device or picks NCCL, the body here picks gloo without GPUs, as the cookbook's notebooks do.
The README's table in "On Databricks" lists every documented name and what it does on this machine; the last test
checks that each of them is run here.
"""
import re
import time
import warnings
from pathlib import Path

import psutil
import pytest
from launcher_checks import simulate_gpus

import nbhelpers


def run_cell(cell: str, imports: dict) -> dict:
    """Execute `cell` after replacing each documented import by the cookbook's; its namespace."""
    for documented, here in imports.items():
        assert documented in cell, documented
        cell = cell.replace(documented, here)
    namespace = {}
    exec(compile(cell, "<a cell from Databricks' docs>", "exec"), namespace)
    return namespace


BODY = """
    import os
    import torch
    import torch.distributed as dist

    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    total = torch.ones(1)
    dist.all_reduce(total)
    dist.destroy_process_group()
    return {"rank": int(os.environ["RANK"]), "local_rank": int(os.environ["LOCAL_RANK"]), "sum": total.item()}
"""

AIR_QUICKSTART = """
from databricks.air import distributed

# By default, @distributed uses every GPU on the node your notebook is connected
# to. To use fewer, pass num_accelerators (for example, num_accelerators=2).
@distributed()
def train():""" + BODY + """
results = train.distributed()
"""


def test_the_ai_runtime_quickstart_runs_on_every_gpu_of_the_node():
    namespace = run_cell(AIR_QUICKSTART, {"from databricks.air import distributed": "from nbhelpers import distributed"})
    assert namespace["results"] == [{"rank": r, "local_rank": r, "sum": 2.0} for r in (0, 1)]  # no GPU: 2 CPU ranks


def test_the_ai_runtime_quickstart_with_fewer_accelerators_runs_that_many_ranks(monkeypatch, tmp_path):
    simulate_gpus(monkeypatch, tmp_path, 4, "NVIDIA H100 80GB HBM3")
    cell = AIR_QUICKSTART.replace("@distributed()", "@distributed(num_accelerators=2)")
    namespace = run_cell(cell, {"from databricks.air import distributed": "from nbhelpers import distributed"})
    assert [r["rank"] for r in namespace["results"]] == [0, 1]


AIR_PYPI_EXAMPLE = """
import databricks.air


@databricks.air.distributed(num_accelerators=8, accelerator_type="GPU_8xH100")
def train_model():""" + BODY + """
results = train_model.distributed()
"""


def test_the_sdks_example_with_accelerator_type_runs_on_the_h100s_it_names(monkeypatch, tmp_path):
    simulate_gpus(monkeypatch, tmp_path, 8, "NVIDIA H100 80GB HBM3")
    namespace = run_cell(AIR_PYPI_EXAMPLE, {"import databricks.air\n": "import nbhelpers\n",
                                            "@databricks.air.distributed": "@nbhelpers.distributed"})
    assert [r["rank"] for r in namespace["results"]] == list(range(8))
    assert {r["sum"] for r in namespace["results"]} == {8.0}


def test_an_accelerator_type_other_than_the_visible_gpus_is_refused_naming_both(monkeypatch, tmp_path):
    simulate_gpus(monkeypatch, tmp_path, 8, "NVIDIA H200")
    with pytest.raises(ValueError, match=r"accelerator_type='GPU_1xA10' but the GPUs visible here are NVIDIA H200 \(8x\)"):
        nbhelpers.distributed(num_accelerators=1, accelerator_type="GPU_1xA10")(print)


def test_an_accelerator_type_whose_node_shape_differs_from_the_visible_gpus_is_refused(monkeypatch, tmp_path):
    simulate_gpus(monkeypatch, tmp_path, 8, "NVIDIA H100 80GB HBM3")
    with pytest.raises(ValueError, match=r"accelerator_type='GPU_1xH100' is a node of 1 H100 GPU\(s\), but 8 are visible"):
        nbhelpers.distributed(num_accelerators=1, accelerator_type="GPU_1xH100")(print)
    simulate_gpus(monkeypatch, tmp_path, 1, "NVIDIA H100 80GB HBM3")
    with pytest.raises(ValueError, match=r"'GPU_8xH100' is a node of 8 H100 GPU\(s\), but 1 are visible"):
        nbhelpers.distributed(accelerator_type="GPU_8xH100")(print)
    with pytest.raises(ValueError, match=r"accelerator_type='H100' is not a node shape .* GPU_1xA10, GPU_1xH100, "
                                         r"GPU_8xH100, GPU_8xB300"):
        nbhelpers.distributed(accelerator_type="H100")(print)
    nbhelpers.distributed(accelerator_type="GPU_1xH100")(print)  # the shape of this node: accepted


AIR_DOCSTRING_EXAMPLE = """
from databricks.air import distributed

@distributed(num_accelerators=8, accelerator_type="GPU_8xH100", timeout=3600)  # 60 minutes
def train(lr, epochs):
    # import statements and function code here
    import os
    return (int(os.environ["RANK"]), lr, epochs)

# Run the function in parallel by calling `.distributed()`
results = train.distributed(lr=0.01, epochs=10)
"""


def test_the_decorators_docstring_example_with_a_timeout_runs_on_the_node(monkeypatch, tmp_path):
    simulate_gpus(monkeypatch, tmp_path, 8, "NVIDIA H100 80GB HBM3")
    namespace = run_cell(AIR_DOCSTRING_EXAMPLE, {"from databricks.air import distributed": "from nbhelpers import distributed"})
    assert namespace["results"] == [(rank, 0.01, 10) for rank in range(8)]
    assert namespace["train"].timeout == 3600


def test_the_decorator_takes_databricks_positional_arguments(monkeypatch, tmp_path):
    simulate_gpus(monkeypatch, tmp_path, 8, "NVIDIA H100 80GB HBM3")
    decorated = nbhelpers.distributed(2, "GPU_8xH100", False, 60)(print)
    assert (decorated.gpus, decorated.gpu_type, decorated.timeout) == (2, "GPU_8xH100", 60)


def _sleeps_with_a_child_in_its_own_session():
    import subprocess
    import time

    child = subprocess.Popen(["sleep", "300"], start_new_session=True)  # outside the rank's process group
    print(f"child {child.pid}", flush=True)
    time.sleep(300)


def test_the_timeout_stops_every_rank_and_what_they_started_and_names_the_limit(capsys):
    timed = nbhelpers.distributed(timeout=1.5)(_sleeps_with_a_child_in_its_own_session)
    started = time.monotonic()
    with pytest.raises(nbhelpers.DistributedTimeoutError) as caught:
        timed.distributed()
    assert time.monotonic() - started < 30
    message = str(caught.value)
    assert "_sleeps_with_a_child_in_its_own_session() ran past its timeout of 1.5 s (wall clock); all 2 ranks were " \
           "stopped" in message, message
    assert "@distributed(timeout=...)" in message and "timeout=None runs without a limit" in message, message
    assert isinstance(caught.value, TimeoutError) and caught.value.timeout == 1.5
    children = [int(pid) for pid in re.findall(r"^\[rank \d\] child (\d+)$", capsys.readouterr().out, re.MULTILINE)]
    assert len(children) == 2
    deadline = time.monotonic() + 3  # the kernel reaps asynchronously
    while (left := _left_running(children)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not left, f"left running: {left}"


def _left_running(pids) -> list:
    """Of `pids` and this process's descendants, those running, but the fork server and resource tracker (kept)."""
    me = psutil.Process()
    left = []
    for p in [*me.children(recursive=True), *(psutil.Process(pid) for pid in pids if psutil.pid_exists(pid))]:
        try:
            kept = p.ppid() == me.pid and any(m in " ".join(p.cmdline()) for m in ("forkserver", "resource_tracker"))
            if p.status() != psutil.STATUS_ZOMBIE and not kept:
                left.append((p.pid, p.cmdline()))
        except psutil.Error:
            continue
    return left


def test_the_timeout_is_not_restarted_by_max_restarts():
    timed = nbhelpers.distributed(timeout=1, max_restarts=2)(time.sleep)
    started = time.monotonic()
    with pytest.raises(nbhelpers.LocalExecutionTimeoutError, match=r"ran past its timeout of 1 s"):  # databricks.air's name
        timed.distributed(60)
    assert time.monotonic() - started < 15


def test_a_timeout_that_is_no_positive_number_is_refused():
    for bad in (0, -5, True, "600"):
        with pytest.raises(ValueError, match=r"timeout must be a positive number of seconds or None"):
            nbhelpers.distributed(timeout=bad)(print)
    assert nbhelpers.distributed(print).timeout == 10800 and nbhelpers.distributed(timeout=None)(print).timeout is None


def test_remote_with_a_timeout_other_than_the_default_warns_that_it_applies_to_local_runs_only(monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:1")  # "attached" (nothing is contacted before a launch)
    with pytest.warns(UserWarning, match=r"timeout=600 applies to local runs only \(remote=False\)"):
        nbhelpers.distributed(remote=True, timeout=600)(print)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        nbhelpers.distributed(remote=True)(print)  # the default: no warning


def _rank_and_setting(setting):
    import os

    return int(os.environ["RANK"]), setting


def test_with_overrides_returns_a_new_function_with_those_values_changed_and_the_others_kept(monkeypatch, tmp_path):
    simulate_gpus(monkeypatch, tmp_path, 8, "NVIDIA H100 80GB HBM3")
    train = nbhelpers.distributed(num_accelerators=4, accelerator_type="GPU_8xH100", timeout=3600,
                                  output="rank0")(_rank_and_setting)
    quick = train.with_overrides(num_accelerators=2, timeout=None)
    assert (quick.gpus, quick.gpu_type, quick.timeout, quick.output) == (2, "GPU_8xH100", None, "rank0")
    assert (train.gpus, train.timeout) == (4, 3600)  # the original is unchanged
    assert train.with_overrides(num_accelerators=None).gpus == 4  # None leaves it, as databricks.air's does
    assert train.with_overrides(gpus=3).gpus == 3  # the other spelling replaces it
    assert quick.distributed("x") == [(0, "x"), (1, "x")]
    assert quick.func is train.func is _rank_and_setting


def test_with_overrides_validates_like_the_decorator(monkeypatch, tmp_path):
    simulate_gpus(monkeypatch, tmp_path, 8, "NVIDIA H100 80GB HBM3")
    train = nbhelpers.distributed(num_accelerators=2)(print)
    with pytest.raises(ValueError, match=r"timeout must be a positive number of seconds or None"):
        train.with_overrides(timeout=-1)
    with pytest.raises(ValueError, match=r"gpus=9 but only 8 GPU\(s\) are visible"):
        train.with_overrides(num_accelerators=9)
    with pytest.raises(ValueError, match=r"accelerator_type='GPU_1xA10' but the GPUs visible here are NVIDIA H100"):
        train.with_overrides(accelerator_type="GPU_1xA10")
    with pytest.raises(TypeError, match=r"with_overrides\(\) got unknown argument\(s\) gpu_count"):
        train.with_overrides(gpu_count=2)


def test_func_is_the_undecorated_function_and_a_plain_call_still_runs_here():
    def train(lr):
        import os

        return lr, os.environ.get("WORLD_SIZE")

    decorated = nbhelpers.distributed(train)
    assert decorated.func is train and decorated.with_overrides(timeout=5).func is train
    assert decorated(0.1) == (0.1, "1")  # ours runs a plain call in this process, as rank 0 of 1 (databricks.air refuses)


def _says_hello_and_fails_on_rank_1():
    import os
    import sys

    rank = int(os.environ["RANK"])
    print(f"hello from rank {rank}", flush=True)
    print(f"a warning on stderr of rank {rank}", file=sys.stderr, flush=True)
    if rank == 1:
        raise RuntimeError("rank 1 gives up")
    return rank


def test_each_ranks_log_is_saved_to_the_active_mlflow_run_as_an_artifact(tmp_path):
    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    try:
        experiment = mlflow.create_experiment("rank-logs", artifact_location=(tmp_path / "artifacts").as_uri())
        with mlflow.start_run(experiment_id=experiment) as run:
            with pytest.raises(nbhelpers.DistributedError, match="rank 1 gives up"):
                nbhelpers.distributed(output="rank0")(_says_hello_and_fails_on_rank_1).distributed()
        client = mlflow.MlflowClient()
        assert sorted(a.path for a in client.list_artifacts(run.info.run_id, "logs")) == ["logs/rank_0.txt",
                                                                                          "logs/rank_1.txt"]
        folder = Path(client.download_artifacts(run.info.run_id, "logs", str(tmp_path / "down")))
        for rank in (0, 1):  # rank 1's too, though output="rank0" kept it out of the cell
            log = (folder / f"rank_{rank}.txt").read_text()
            assert f"hello from rank {rank}\n" in log and f"a warning on stderr of rank {rank}\n" in log, log
        assert "RuntimeError: rank 1 gives up" in (folder / "rank_1.txt").read_text()
    finally:
        mlflow.set_tracking_uri(None)


def test_a_ranks_log_is_bounded_keeping_its_start_and_its_end():
    from nbhelpers.launch.output import RankLog

    log = RankLog()
    log.feed(b"first line\n")
    for _ in range(2000):
        log.feed(b"x" * 1023 + b"\n")
    log.feed(b"last line\n")
    text = log.text()
    assert text.startswith("first line\n") and text.endswith("last line\n")
    assert len(text) < RankLog.HEAD_BYTES + RankLog.TAIL_BYTES + 200
    assert re.search(r"\[\.\.\. \d+ bytes of this rank's output left out \.\.\.\]", text)


SERVERLESS_GPU_RUNTIME_EXAMPLE = """
from serverless_gpu import distributed
from serverless_gpu import runtime as rt

@distributed(
    gpus=8,
    gpu_type='h100',
)
def hello_world(name: str) -> list[int]:
    if rt.get_local_rank() == 0:
        print('hello world', name)
    return rt.get_global_rank()

result = hello_world.distributed('Example')
# result == [0, 1, 2, 3, 4, 5, 6, 7]
"""


def test_the_serverless_gpu_hello_world_returns_each_ranks_global_rank(monkeypatch, tmp_path, capsys):
    simulate_gpus(monkeypatch, tmp_path, 8, "NVIDIA H100 80GB HBM3")
    namespace = run_cell(SERVERLESS_GPU_RUNTIME_EXAMPLE, {
        "from serverless_gpu import distributed": "from nbhelpers import distributed",
        "from serverless_gpu import runtime as rt": "from nbhelpers import runtime as rt"})
    assert namespace["result"] == [0, 1, 2, 3, 4, 5, 6, 7]
    assert "[rank 0] hello world Example" in capsys.readouterr().out


SERVERLESS_GPU_CELL = """
from serverless_gpu import distributed

@distributed(gpus=2, gpu_type="H100", remote=False)
def run_train():""" + BODY + """
results = run_train.distributed()
"""


def test_a_serverless_gpu_cell_without_gpus_runs_on_cpu_processes_and_says_gpu_type_is_ignored(capsys):
    namespace = run_cell(SERVERLESS_GPU_CELL, {"from serverless_gpu import distributed": "from nbhelpers import distributed"})
    assert [r["sum"] for r in namespace["results"]] == [2.0, 2.0]
    said = capsys.readouterr().err
    assert said.count("gpu_type='H100' ignored: no GPU is visible here") == 1, said


BARE_DECORATOR = """
from serverless_gpu import distributed

@distributed
def train():""" + BODY + """
results = train.distributed()
"""


def test_the_bare_decorator_runs_on_every_gpu_of_the_node():
    namespace = run_cell(BARE_DECORATOR, {"from serverless_gpu import distributed": "from nbhelpers import distributed"})
    assert [r["rank"] for r in namespace["results"]] == [0, 1]


@pytest.mark.parametrize("variable", ["DATABRICKS_REMOTE_GPU_POOL_ID", "DATABRICKS_USE_RESERVED_GPU_POOL"])
def test_gpu_pool_variables_are_databricks_provisioning_and_said_to_be_ignored(monkeypatch, capsys, variable):
    monkeypatch.setenv(variable, "pool-1234" if variable.endswith("_ID") else "true")
    namespace = run_cell(BARE_DECORATOR, {"from serverless_gpu import distributed": "from nbhelpers import distributed"})
    assert len(namespace["results"]) == 2
    assert f"@distributed: {variable} ignored: GPU pools are Databricks provisioning" in capsys.readouterr().err


def test_both_spellings_of_one_setting_with_different_values_are_refused():
    with pytest.raises(ValueError, match=r"gpus=2 and num_accelerators=4 name the same setting"):
        nbhelpers.distributed(gpus=2, num_accelerators=4)(print)
    with pytest.raises(ValueError, match=r"gpu_type='H100' and accelerator_type='GPU_8xH200' name the same setting"):
        nbhelpers.ray_launch(gpu_type="H100", accelerator_type="GPU_8xH200")(print)


def test_ray_launch_without_a_cluster_and_remote_says_what_to_do():
    pytest.importorskip("ray")

    @nbhelpers.ray_launch(gpus=4, gpu_type="A10", remote=True)
    def uses_ray():
        return 1

    with pytest.raises(RuntimeError, match=r"attached to none. Call ray.init\(address=\"HEAD_IP:6379\"\)"):
        uses_ray.distributed()


def test_every_name_of_the_readmes_databricks_table_is_run_by_a_test_here():
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    table = readme.split("## On Databricks", 1)[1].split("\n## ", 1)[0]
    names = set()
    for row in re.findall(r"^\| (.+?) \| .+ \|$", table, flags=re.MULTILINE)[2:]:  # the first column, past the header
        for code in re.findall(r"`([^`]+)`", row):
            names |= set(re.findall(r"[A-Za-z_][A-Za-z_0-9]*", code)) - {"from", "import", "N"}
    source = Path(__file__).read_text().split("def test_every_name_of_the_readmes", 1)[0]
    assert names and not {n for n in names if n not in source}, f"not run here: {sorted(n for n in names if n not in source)}"
