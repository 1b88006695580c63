"""A recipe's workload.yaml run as Databricks' AI Runtime runs it (issue 42 §3), on this machine's CPUs: its `command`
as written, through bash, in a copy of the code source the platform uploads (root_path's include_paths, nothing
else), with the variables the platform sets on a node of a
one-node job (NUM_NODES=1, NODE_RANK=0, MASTER_ADDR, MASTER_PORT, LOCAL_WORLD_SIZE, MLFLOW_RUN_ID, and
HYPERPARAMETERS_PATH to the workload's `parameters` with the test's tiny stand-in, local data, tmp_path output and few
steps in place of the hub ids, Volume paths and real sizes). The recipe tests launch a recipe's first run this way
(tests/test_recipes.py, tests/test_ray_recipes.py), so a workload file that no longer runs its recipe fails there, at
no CI time of its own.

    metrics, run = run_workload("fsdp_llama_3_1_8b_multinode", {"model_name_or_path": ..., ...}, tmp_path)

What every such run must show: exit code 0, metrics.json in the output_dir it was given, and its params and metrics
in the MLflow run MLFLOW_RUN_ID named (a run made beforehand in a local store, tmp_path/mlflow.db, in the workload's
experiment, as the platform makes one), with no MLflow run or experiment of its own.

The command's `pip install --no-deps -e .` is not run: it would rewrite the venv's editable install of nbhelpers while
the other pytest-xdist workers import it, and pip's build isolation would fetch setuptools from an index that the
hermetic `make test` (a fresh HOME, so no pip configuration) may not reach. CI's venv already has that install
(`make setup`: pip install -e ".[all]" of this tree, the code source root), which this module checks; a `pip` placed
first on PATH records its arguments and folder (they must be that install from the code source root) and exits 0.
"""
from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
PIP_THAT_RECORDS = """#!/bin/sh
# The workload's pip, made a no-op for the test (tests/workload_runs.py says why): it records what it was asked.
printf '%s\\n' "$PWD" "$*" >> "$PIP_CALLS"
"""


def workload(recipe: str) -> dict:
    return yaml.safe_load((REPO / "recipes" / recipe / "workload.yaml").read_text())


def run_workload(recipe: str, parameters: dict, tmp_path: Path, *, env: dict | None = None, local_world_size: int = 2,
                 timeout: float = 300) -> tuple[dict, object]:
    """Run RECIPE's workload command with the workload's `parameters` updated by PARAMETERS (which must replace its
    hub ids and Volume paths); (the metrics.json it wrote, the platform's MLflow run as it was left). ENV: the
    environment to start from (default os.environ; the Ray tests give their cluster's, so the recipe joins it)."""
    import mlflow

    import nbhelpers
    from nbhelpers.launch.processes import free_port

    spec = workload(recipe)
    settings = {**spec["parameters"], **parameters}
    for key, value in settings.items():  # nothing of the real job is left: no Volume, no hub download
        assert not str(value).startswith("/Volumes/"), f"{key}: {value} (give a tmp_path folder)"
    for key in ("model_name_or_path", "dataset_name"):
        assert key not in settings or Path(settings[key]).exists(), f"{key}: {settings[key]} (give a local stand-in)"
    output_dir = Path(settings["output_dir"])
    hyperparameters = tmp_path / "hyperparameters.yaml"
    hyperparameters.write_text(yaml.safe_dump({k: str(v) if isinstance(v, Path) else v for k, v in settings.items()}))

    # The platform's run, made before the command starts, in the workload's experiment of a local store.
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = mlflow.MlflowClient(store)
    experiment = (client.get_experiment_by_name(spec["experiment_name"]) or
                  client.get_experiment(client.create_experiment(spec["experiment_name"], artifact_location=(
                      tmp_path / "mlartifacts").as_uri()))).experiment_id
    platform_run = client.create_run(experiment).info.run_id
    runs_before = {r.info.run_id for r in client.search_runs(
        [e.experiment_id for e in client.search_experiments()])}

    # pip: recorded, not run (see the docstring); the install the command asks for is the one CI's venv has.
    assert Path(nbhelpers.__file__).resolve().parent == REPO / "nbhelpers", nbhelpers.__file__
    shims = tmp_path / "platform-bin"
    shims.mkdir(exist_ok=True)
    (shims / "pip").write_text(PIP_THAT_RECORDS)
    (shims / "pip").chmod(0o755)
    pip_calls = tmp_path / "pip-calls.txt"
    snapshot = code_source_snapshot(spec, recipe, tmp_path / "code_source")

    base = dict(os.environ if env is None else env)
    platform = {
        **spec.get("env_variables", {}),
        # where the real job's variables would write outside the test (a workspace, /tmp/hf): this test's folders
        "MLFLOW_TRACKING_URI": store, "HF_HOME": str(tmp_path / "hf"),
        "NUM_NODES": "1", "NODE_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
        "LOCAL_WORLD_SIZE": str(local_world_size), "MLFLOW_RUN_ID": platform_run,
        "HYPERPARAMETERS_PATH": str(hyperparameters), "CODE_SOURCE_PATH": str(snapshot),
        # `python` and `torchrun` of this venv (CI's PATH need not have it), after the recording pip
        "PATH": os.pathsep.join([str(shims), str(Path(sys.executable).parent), base.get("PATH", "")]),
        "PIP_CALLS": str(pip_calls), "OMP_NUM_THREADS": "1",
    }
    log = tmp_path / f"{recipe}-workload.log"
    with log.open("w") as out:
        proc = subprocess.Popen(["bash", "-c", spec["command"]], cwd=snapshot, env={**base, **platform}, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            proc.wait(timeout=timeout)
            outcome = f"failed ({proc.returncode})"
        except subprocess.TimeoutExpired:
            outcome = f"did not finish in {timeout} s (killed)"
        finally:
            kill_process_tree(proc)
    assert proc.returncode == 0, (f"{recipe}'s workload command {outcome}:\n"
                                  f"{shlex.quote(spec['command'])}\n{log.read_text()[-6000:]}")
    assert pip_calls.read_text().splitlines() == [str(snapshot), "install --no-deps -e ."], pip_calls.read_text()
    metrics = json.loads((output_dir / "metrics.json").read_text())

    # It logged into the platform's run, and opened none of its own.
    run = client.get_run(platform_run)
    named = [k for k in ("model_name_or_path", "dataset_name") if k in settings]
    assert named and all(run.data.params.get(k) == str(settings[k]) for k in named), (run.data.params, settings)
    assert run.data.metrics, "the recipe logged no metric into MLFLOW_RUN_ID"
    runs_after = {r.info.run_id for r in client.search_runs([e.experiment_id for e in client.search_experiments()])}
    assert runs_after == runs_before, f"the recipe opened run(s) of its own: {runs_after - runs_before}"
    return metrics, run


def code_source_snapshot(spec: dict, recipe: str, folder: Path) -> Path:
    """What the platform unpacks as CODE_SOURCE_PATH: the include_paths of the snapshot's root_path, copied."""
    snapshot = spec["code_source"]["snapshot"]
    root = (REPO / "recipes" / recipe / snapshot["root_path"]).resolve()
    for path in snapshot["include_paths"]:
        source, target = root / path, folder / path
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"), dirs_exist_ok=True)
        else:
            shutil.copy2(source, target)
    return folder


def kill_process_tree(proc: subprocess.Popen) -> None:
    """SIGKILL a launched command and everything it started, as if the machine died (torchrun gives each worker a
    session of its own, so a process group does not reach them)."""
    import psutil

    try:
        left = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        left = []
    for process in [*left, psutil.Process(proc.pid)] if proc.poll() is None else left:
        try:
            process.kill()
        except psutil.NoSuchProcess:
            pass
    proc.wait()
