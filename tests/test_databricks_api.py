"""Code from Databricks' documentation runs with only the import changed (issue 29): the AI Runtime SDK
(`databricks.air`, GPU environment 6 and later) and `serverless_gpu` (environment 5 and earlier).

Each cell below keeps the decorator, the arguments and the call of a documented example; where the example's
body binds a CUDA device or picks NCCL, the body here picks gloo without GPUs, as the cookbook's notebooks do.
The README's table in "On Databricks" lists every documented name and what it does on this machine; the last test
checks that each of them is run here.
"""
import re
from pathlib import Path

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
    with pytest.raises(ValueError, match=r"gpu_type='GPU_1xA10' but the GPUs visible here are NVIDIA H200 \(8x\)"):
        nbhelpers.distributed(num_accelerators=1, accelerator_type="GPU_1xA10")(print)


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
