import os

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
}.items():
    os.environ.setdefault(key, value)

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def standin(tmp_path_factory):
    """standin(NAME) -> folder of a tiny offline stand-in model (built once per test session).

    NAME is an architecture of nbhelpers.standins, with "+mxfp4" for GPT-OSS experts stored as on the hub.
    """
    root = tmp_path_factory.mktemp("standins")
    built = {}

    def build(name: str):
        if name not in built:
            from nbhelpers import standins

            arch, _, variant = name.partition("+")
            built[name] = standins.make(arch, size="tiny", out=root / name, mxfp4=variant == "mxfp4")
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
