import gc
import os

# The test processes import torch, Transformers, MLflow, papermill...: a collection meanwhile only walks what stays
# imported (an eighth of the collection time). Collection resumes, those objects frozen, when the tests start.
gc.disable()

# No hub, no telemetry, no cloud probes: set before anything imports transformers, trl, axolotl or ray,
# and inherited by the notebook kernels and ranks the tests start.
for key, value in {
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "AXOLOTL_DO_NOT_TRACK": "1",
    "RAY_USAGE_STATS_ENABLED": "0",
    "DO_NOT_TRACK": "1",
    "MPLBACKEND": "Agg",
    "TOKENIZERS_PARALLELISM": "false",
    # Three test streams share the machine's cores: one OpenMP thread per process (the launcher gives a rank all the
    # cores it sees free, not knowing of the other streams, whose spinning threads then slow every one of them).
    "OMP_NUM_THREADS": "1",
}.items():
    os.environ.setdefault(key, value)

import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

# The tests' CPU fixes of TRL, accelerate and DeepSpeed (hooks/cpu_fixes.py) and their test hooks: in this process,
# and through hooks/sitecustomize.py in every process the tests start (kernels, fork servers, ranks, torchrun's
# workers), which inherit this PYTHONPATH. The package users import (nbhelpers) changes no library.
HOOKS = str(Path(__file__).resolve().parent / "hooks")
sys.path.insert(0, HOOKS)
os.environ["PYTHONPATH"] = os.pathsep.join([HOOKS, *filter(None, [os.environ.get("PYTHONPATH")])])
import cpu_fixes  # noqa: E402
from after_import import when_imported  # noqa: E402

for _module in cpu_fixes.FIXES:
    when_imported(_module, cpu_fixes.apply_without_gpus)

@pytest.fixture(scope="session")
def standin(tmp_path_factory):
    """standin(NAME) -> folder of a tiny offline stand-in model (built once per test session).

    NAME is an architecture of tests/standins.py, with "+mxfp4" for GPT-OSS experts stored as on the hub, or
    "@full" for the published size without weights (config and tokenizer: enough for the memory planner).
    """
    root = tmp_path_factory.mktemp("standins")
    built = {}

    def build(name: str):
        if name not in built:
            import standins

            arch, size = name.split("@") if "@" in name else (name, "tiny")
            arch, _, variant = arch.partition("+")
            built[name] = standins.make(arch, size=size, out=root / name, mxfp4=variant == "mxfp4", weights=size == "tiny")
        return built[name]

    return build


@pytest.fixture(scope="session")
def notebook_run(tmp_path_factory, standin):
    """notebook_run(case) -> (metrics, executed notebook, workdir): each case of notebook_cases.py runs once per
    session, so a test of what a run left behind (its MLflow store, its merged model) reuses the smoke run."""
    from harness import run_notebook

    runs = {}

    def run(case):
        if id(case) not in runs:
            workdir = tmp_path_factory.mktemp("notebook")
            runs[id(case)] = (*run_notebook(case, workdir, standin), workdir)
        return runs[id(case)]

    return run


@pytest.fixture(autouse=True)
def interrupts_left_as_they_were():
    """A test that leaves this process's SIGINT handler changed fails, named (an ignored SIGINT would be inherited by
    every process a later test starts). The handler is put back."""
    import signal

    before = signal.getsignal(signal.SIGINT)
    yield
    after = signal.getsignal(signal.SIGINT)
    if after is not before:
        if before is not None:  # None: a handler installed from C, which cannot be put back
            signal.signal(signal.SIGINT, before)
        pytest.fail(f"this test left SIGINT's handler {after!r} (it was {before!r})")


@pytest.fixture(autouse=True)
def no_mlflow_store_chosen(monkeypatch):
    """Each test starts without MLFLOW_TRACKING_URI: mlflow.set_tracking_uri() in an earlier test sets it in this
    process, and the notebooks and recipes a test starts would track into that test's store instead of their own."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)


# The files that take minutes (each runs notebooks or recipes several times), longest first, as measured on the CI
# machine on 2026-12-05. pytest-xdist (--dist loadfile --no-loadscope-reorder, in the Makefile) hands files out in
# collection order; its default order (most tests first) had started the two-test Ray recipes file last, and the run's
# last three minutes were that file alone. Started first, the long files run beside the many short ones instead.
LONGEST_FIRST = [
    "test_axolotl_notebook.py", "test_fsdp2_transformer.py", "test_ray_recipes.py", "test_trl_deepspeed_llama_3_2_1b.py",
    "test_trl_ddp_gpt_oss_20b.py", "test_trl_fsdp_gpt_oss_120b.py", "test_unsloth_notebook.py", "test_recipes.py",
    "test_lightning_notebook.py", "test_retinanet_notebook.py", "test_distributed.py", "test_notebooks.py",
    "test_qwen35_recipe.py", "test_ray.py", "test_surviving_failures.py", "test_cpu_fixes.py", "test_fast_steps.py",
]


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: each file's own order is kept


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own, which ends the hook in its controller process
def pytest_runtestloop(session):
    gc.freeze()
    gc.enable()
