"""Runs a notebook case with papermill and returns its metrics (see notebook_cases.py)."""
from __future__ import annotations

import atexit
import contextlib
import importlib.util
import json
import operator
import os
import re
import shutil

import pytest
from unittest import mock
import tempfile
from pathlib import Path

import nbformat
import papermill
import yaml

import forked_kernels

REPO = Path(__file__).resolve().parents[1]
HOOKS = REPO / "tests" / "hooks"  # sitecustomize.py + cookbook_hooks.py: see cookbook_hooks.py
OPS = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge, "==": operator.eq, "!=": operator.ne}


class UnknownParameterError(ValueError):
    pass


def declared_parameters(notebook: Path) -> dict:
    return papermill.inspect_notebook(str(notebook))


_GENERATED = {}


def generated_dataset(name: str) -> Path:
    """The folder that `data/make_<name>.py`'s `make(out)` writes, made once per test process."""
    if name not in _GENERATED:
        script = REPO / "data" / f"make_{name}.py"
        if not script.is_file():
            raise KeyError(f"{{dataset:{name}}} needs {script}, which does not exist")
        spec = importlib.util.spec_from_file_location(f"make_{name}", script)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        out = Path(tempfile.mkdtemp(prefix=f"dataset-{name}-"))
        atexit.register(shutil.rmtree, out, ignore_errors=True)
        _GENERATED[name] = Path(module.make(out))
    return _GENERATED[name]


def fill(value, output_dir: Path, standin):
    """Replace the {placeholders} of notebook_cases.py in a parameter value (in each item of a list or dict too)."""
    if isinstance(value, list):
        return [fill(item, output_dir, standin) for item in value]
    if isinstance(value, dict):
        return {key: fill(item, output_dir, standin) for key, item in value.items()}
    if not isinstance(value, str):
        return value

    def sub(match):
        key = match.group(1)
        if key == "output_dir":
            return str(output_dir)
        if key == "repo":
            return str(REPO)
        if key == "data":
            return str(REPO / "data")
        if key.startswith("standin:"):
            return str(standin(key.split(":", 1)[1]))
        if key.startswith("dataset:"):
            return str(generated_dataset(key.split(":", 1)[1]))
        raise KeyError(f"unknown placeholder {{{key}}} in a notebook case")

    return re.sub(r"\{([a-z_]+(?::[A-Za-z0-9_.+@\-]+)?)\}", sub, value)


def run_notebook(case, workdir: Path, standin=None):
    """Execute `case.notebook` into `workdir`; return (metrics dict, executed notebook)."""
    notebook = REPO / case.notebook
    declared = declared_parameters(notebook)
    unknown = sorted(set(case.parameters) - set(declared))
    if unknown:
        raise UnknownParameterError(
            f"{case.notebook} has no parameter(s) {unknown}; its parameters cell declares {sorted(declared)}"
        )
    workdir.mkdir(parents=True, exist_ok=True)
    output_dir = workdir / "output"
    parameters = {k: fill(v, output_dir, standin) for k, v in case.parameters.items()}
    for name, value in parameters.items():  # a dict is a settings file: written as YAML, its path passed
        if isinstance(value, dict):
            path = workdir / f"{name}.yml"
            path.write_text(yaml.safe_dump(value))
            parameters[name] = str(path)
    executed = workdir / Path(case.notebook).name
    require_kernel(case.kernel)
    if case.cpu_fixes:  # (without them the kernel's PYTHONPATH differs from the zygote's: it would not serve it)
        forked_kernels.start(case.kernel)  # before hooks_in_kernel changes the environment for this kernel
    with hooks_in_kernel(case.hooks, workdir / "hooks", cpu_fixes=case.cpu_fixes):
        papermill.execute_notebook(
            str(notebook),
            str(executed),
            parameters=parameters,
            cwd=str(notebook.parent),
            execution_timeout=case.timeout,
            kernel_name=case.kernel,
            progress_bar=False,
            kernel_manager_class=forked_kernels.ForkedKernelManager,
        )
    metrics = json.loads((output_dir / "metrics.json").read_text())
    if case.hooks:  # for expectations such as "hooks.record_checkpoint_writers.ranks"
        metrics["hooks"] = {}
        for name in _hook_module().parse(",".join(case.hooks)):
            records = hook_records(workdir, name)
            ranks = sorted({r["rank"] for r in records if r["rank"] is not None})
            # and each recorded field, the ranks' values in rank order: "hooks.record_lightning_trainer.world_size"
            by_rank = sorted(records, key=lambda r: (r["rank"] is None, r["rank"] or 0))
            keys = dict.fromkeys(key for r in records for key in r if key not in ("pid", "rank"))
            fields = {key: [r.get(key) for r in by_rank] for key in keys}
            metrics["hooks"][name] = {**fields, "count": len(records), "ranks": ranks, "records": records}
    if any(name.startswith("mlflow.") for name in case.expect):  # e.g. "mlflow.models.model.loads"
        metrics["mlflow"] = mlflow_store(project_store(workdir))
    return metrics, nbformat.read(executed, as_version=4)


def project_store(workdir: Path) -> str:
    """The MLflow store a case's run went to: the project's, in the folder above its output_dir."""
    return f"sqlite:///{workdir / 'mlflow.db'}"


def mlflow_store(tracking_uri: str) -> dict:
    """What the newest finished run in the MLflow store at `tracking_uri` holds: its params (strings, as MLflow keeps
    them), its metrics (last values), and each model logged from it, by name: its flavors, whether it has a
    signature, whether its flavor's load_model loads it and (PyTorch models with an input example) it predicts."""
    import mlflow
    from mlflow.models import Model

    client = mlflow.MlflowClient(tracking_uri)
    experiments = [e.experiment_id for e in client.search_experiments()]
    runs = client.search_runs(experiments, "attributes.status = 'FINISHED'", order_by=["attributes.start_time DESC"],
                              max_results=1)
    if not runs:
        return {"runs": 0}
    run, models = runs[0], {}
    mlflow.set_tracking_uri(tracking_uri)
    for logged in mlflow.search_logged_models(experiment_ids=experiments, output_format="list",
                                              filter_string=f"source_run_id = '{run.info.run_id}'"):
        info = Model.load(logged.model_uri)
        flavor = next(f for f in info.flavors if f != "python_function")
        loaded = importlib.import_module(f"mlflow.{flavor}").load_model(logged.model_uri)
        predicts = None
        if flavor == "pytorch" and info.saved_input_example_info:
            import torch

            predicts = loaded(torch.as_tensor(info.load_input_example())) is not None
        models[logged.name] = {"flavors": sorted(info.flavors), "has_signature": info.signature is not None,
                               "loads": loaded is not None, "predicts": predicts}
    return {"runs": len(client.search_runs(experiments)), "params": run.data.params, "metrics": run.data.metrics,
            "models": models}


def _hook_module():
    spec = importlib.util.spec_from_file_location("cookbook_hooks", HOOKS / "cookbook_hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@contextlib.contextmanager
def hooks_in_kernel(hooks: tuple, folder: Path, cpu_fixes: bool = True):
    """Start the kernel (and so all it starts) with the test hooks `hooks` installed, recording into `folder`, and
    without an MLflow store chosen for it (MLflow's set_tracking_uri in this process sets MLFLOW_TRACKING_URI, which
    a kernel would inherit: each case's runs go to its own project store).
    cpu_fixes=False: without the CPU fixes of hooks/cpu_fixes.py: with no test hooks, tests/hooks is not on the
    kernel's path at all (as in a user's kernel); with test hooks, COOKBOOK_CPU_FIXES=0 tells sitecustomize.py to
    install those alone."""
    added = {}
    if hooks:
        _hook_module().parse(",".join(hooks))  # an unknown name fails here, not as a warning in the kernel's log
        path = os.environ.get("PYTHONPATH", "").split(os.pathsep)  # conftest.py has put tests/hooks there already
        added = {"PYTHONPATH": os.pathsep.join(filter(None, path if str(HOOKS) in path else [str(HOOKS), *path])),
                 "COOKBOOK_TEST_HOOKS": ",".join(hooks), "COOKBOOK_TEST_HOOKS_DIR": str(folder)}
        if not cpu_fixes:
            added["COOKBOOK_CPU_FIXES"] = "0"
    elif not cpu_fixes:  # conftest.py put tests/hooks on the path of every process the tests start
        added = {"PYTHONPATH": os.pathsep.join(p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                                               if p and p != str(HOOKS))}
    with mock.patch.dict(os.environ, added):  # the kernel inherits this process's environment when papermill starts it
        os.environ.pop("MLFLOW_TRACKING_URI", None)  # (patch.dict restores it afterwards)
        yield


def hook_records(workdir: Path, hook: str) -> list[dict]:
    """What test hook `hook` recorded during run_notebook(case, workdir): one dict per event."""
    path = workdir / "hooks" / f"{hook}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def require_kernel(name: str) -> None:
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    try:
        KernelSpecManager().get_kernel_spec(name)
    except NoSuchKernel:
        raise RuntimeError(f"Jupyter kernel {name!r} is not installed; `make setup-{name.removeprefix('cookbook-')}` "
                           "makes its environment and registers it") from None


def lookup(metrics: dict, dotted: str):
    value = metrics
    for part in dotted.split("."):
        value = value[part]
    return value


def check_expectations(case, metrics: dict) -> list[str]:
    """The expectations of `case` that `metrics` does not meet, as readable lines."""
    failures = []
    for name, (op, bound) in case.expect.items():
        actual = lookup(metrics, name)
        if isinstance(bound, tuple):
            other, factor = bound
            bound = factor * lookup(metrics, other)
        if not OPS[op](actual, bound):
            failures.append(f"{name} = {actual!r}, expected {op} {bound!r}")
    return failures


def output_text(nb) -> str:
    """All stream and text outputs of an executed notebook, joined."""
    parts = []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if out.get("output_type") == "stream":
                parts.append(out.get("text", ""))
            elif "data" in out and "text/plain" in out["data"]:
                parts.append(out["data"]["text/plain"])
            elif out.get("output_type") == "error":
                parts.append("\n".join(out.get("traceback", [])))
    return "".join(parts)


def case_failures(case, metrics: dict, executed, workdir: Path) -> list[str]:
    """What a case's run falls short of: its expectations, the files it must leave, the text its outputs must show."""
    failures = check_expectations(case, metrics)
    failures += [f"output_dir has no {name}" for name in case.files if not (workdir / "output" / name).exists()]
    text = output_text(executed)
    failures += [f"its outputs do not show {expected!r}" for expected in case.output_contains if expected not in text]
    return failures


def _files_in_the_repo() -> set:
    """Every file under the repository but the environments, git's and caches."""
    found = set()
    for folder, subfolders, files in os.walk(REPO):
        subfolders[:] = [d for d in subfolders if d not in (".git", "__pycache__", ".ipynb_checkpoints", ".pytest_cache")
                         and not d.startswith((".venv", ".devsite"))]
        found.update(os.path.join(folder, f) for f in files)
    return found


def _has_gpu() -> bool:
    import torch

    return torch.cuda.device_count() > 0


def _case_id(case) -> str:
    name = case.notebook.removeprefix("notebooks/")
    return name if case.parameters.get("num_gpus") is None else f"{name}-num_gpus={case.parameters['num_gpus']}"


def assert_case_passes(case, notebook_run) -> None:
    """Run `case` (once per session: notebook_run) and check everything it promises."""
    if case.gpu_only and not _has_gpu():
        pytest.skip(f"needs a GPU: {case.gpu_only} (GPU evidence: benchmarks/results/)")
    before = _files_in_the_repo()
    metrics, executed, workdir = notebook_run(case)
    written = sorted(os.path.relpath(p, REPO) for p in _files_in_the_repo() - before)
    assert not written, f"{case.notebook} wrote into the repository instead of output_dir: {written[:5]}"
    failures = case_failures(case, metrics, executed, workdir)
    assert not failures, f"{case.notebook}: " + "; ".join(failures)


def case_ids(cases) -> list[str]:
    return [_case_id(c) for c in cases]
