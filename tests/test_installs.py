"""Installs a user can reproduce (issues 29 §2, 57 §1-2): every environment is its lock (constraints.txt and those of
environments/, written by environments/lock.py), the environments share one MLflow store, the extras and lower bounds
of pyproject.toml, the README's install lines and JupyterLab."""
import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

from harness import REPO

sys.path.insert(0, str(REPO / "environments"))
import lock  # noqa: E402  environments/lock.py: what a lock holds, read the way it was written

BIN = Path(sys.executable).parent


def requirements() -> list[Requirement]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    listed = project["dependencies"] + [r for extra in project["optional-dependencies"].values() for r in extra]
    return [Requirement(r) for r in listed if not r.startswith("nbhelpers")]


def environment_python(name: str) -> Path:
    """The interpreter of each environment `make test` installs: this one, Axolotl's and Unsloth's kernels,
    Databricks' CLI."""
    if name == "main":
        return Path(sys.executable)
    if name in ("axolotl", "unsloth"):
        from jupyter_client.kernelspec import KernelSpecManager

        return Path(KernelSpecManager().get_kernel_spec(f"cookbook-{name}").argv[0])
    return REPO / ".venv-air" / "bin" / "python"


def installed(python: Path) -> dict[str, str]:
    """{normalised name: version} of every distribution installed in `python`'s environment."""
    listing = subprocess.run([python, "-c", "import json; from importlib import metadata; print(json.dumps("
                              "{d.metadata['Name']: d.version for d in metadata.distributions()}))"],
                             capture_output=True, text=True, check=True).stdout
    return {lock.normal(name): version for name, version in json.loads(listing).items()}


@pytest.mark.parametrize("name", list(lock.ENVIRONMENTS))
def test_every_distribution_installed_is_the_locked_one(name):
    python = environment_python(name)
    assert python.is_file(), f"{python} is missing: `make test` installs the {name} environment"
    _, torch_variable, lock_file, _ = lock.ENVIRONMENTS[name]
    locked = lock.read_lock(REPO / lock_file)
    torch_pin = python.parent.parent / "torch-pin.txt"  # what the Makefile installed as torch
    default_torch = bool(torch_variable) and torch_pin.read_text().split() == lock.makefile_value(torch_variable).split()
    if default_torch:
        locked |= lock.read_lock(lock.torch_lock(REPO / lock_file))
    here = {n: v.split("+")[0] for n, v in installed(python).items() if n != "nbhelpers"}  # 2.13.0+cpu is 2.13.0
    if torch_variable and not default_torch:  # a torch of the user's choice brings its own build
        here = {n: v for n, v in here.items() if not lock.TORCH_BUILD.match(n)}
    missing = sorted(set(here) - set(locked))
    differ = {n: (locked[n], v) for n, v in here.items() if n in locked and locked[n] != v}
    assert not missing and not differ, (
        f"the {name} environment is not its lock {lock_file}: installed but not locked {missing}, "
        f"(locked, installed) {differ}. `make lock` writes the locks, `make setup` installs them")


def test_every_environment_has_the_main_environments_mlflow():
    main = lock.read_lock(REPO / "constraints.txt")
    shared = {name: main[name] for name in lock.SHARED_STORE}
    for name, (_, _, lock_file, shares_store) in lock.ENVIRONMENTS.items():
        if shares_store:
            locked = lock.read_lock(REPO / lock_file)
            assert {n: locked.get(n) for n in lock.SHARED_STORE} == shared, lock_file


STORE_ROUND = """
import sys, mlflow
store, name = sys.argv[1], sys.argv[2]
mlflow.set_tracking_uri(store)
mlflow.set_experiment("shared")
with mlflow.start_run(run_name=name):
    mlflow.log_metric("loss", float(len(name)))
runs = mlflow.search_runs(experiment_names=["shared"])
print(sorted(runs["tags.mlflow.runName"]))
"""


def test_one_mlflow_store_is_written_and_read_from_every_environment(tmp_path):
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    sharing = [name for name, (_, _, _, shares_store) in lock.ENVIRONMENTS.items() if shares_store]
    order = ["main", *sharing, "main"]  # main first (it creates the store), each other one, then main reads them all
    seen = []
    for i, name in enumerate(order):
        done = subprocess.run([environment_python(name), "-c", STORE_ROUND, store, f"{i}_from_{name}"],
                              capture_output=True, text=True, cwd=tmp_path, timeout=300)
        assert done.returncode == 0, f"{name}: {done.stderr[-3000:]}"
        seen.append(done.stdout.strip().splitlines()[-1])
    assert seen == [str(sorted(f"{j}_from_{n}" for j, n in enumerate(order[:i + 1]))) for i in range(len(order))]


# Bounds tested on the GPU machine only: torch 2.11 and torchvision 0.26 (benchmarks/results), flash-linear-attention and
# causal-conv1d (CUDA only).
TESTED_ELSEWHERE = {"torch", "torchvision", "flash-linear-attention", "causal-conv1d"}


def extras_of(requirements_: list[str]) -> list[str]:
    """The requirements of this project's `requirements_` (its own `nbhelpers[...]` lines opened up, recursively)."""
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    opened = []
    for line in requirements_:
        if line.startswith("nbhelpers["):
            opened += extras_of([r for extra in line[len("nbhelpers["):-1].split(",") for r in extras[extra]])
        else:
            opened.append(line)
    return opened


def installed_by(name: str) -> list[Requirement]:
    """What the `name` environment installs of this project's requirements: its dependencies and those of the extras
    its install names (`-e .[unsloth]`, `-e .`)."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    install = lock.ENVIRONMENTS[name][0]
    [this] = [item for item in install if item == "." or item.startswith(".[")] or [None]
    if this is None:
        return []
    extras = this[2:-1].split(",") if this != "." else []
    return [Requirement(r) for r in extras_of(project["dependencies"] + [f"nbhelpers[{','.join(extras)}]"] * bool(extras))]


def test_every_range_runs_from_the_oldest_version_tested_to_the_next_major_release():
    """A user's project installs the extras beside its own versions: each requirement is a range (exact pins live only
    in the locks), from the oldest version an environment here installs it at (the lower bounds of TESTED_ELSEWHERE:
    the GPU machine's) up to the next major release after the newest."""
    tested = {}
    for name in lock.ENVIRONMENTS:
        lock_file = REPO / lock.ENVIRONMENTS[name][2]
        locked = lock.read_lock(lock_file) | lock.read_lock(lock.torch_lock(lock_file))
        for requirement in installed_by(name):
            tested.setdefault(lock.normal(requirement.name), set()).add(Version(locked[lock.normal(requirement.name)]))
    for requirement in requirements():
        specs = {spec.operator: Version(spec.version) for spec in requirement.specifier}
        assert set(specs) == {">=", "<"}, f"{requirement}: a range >=OLDEST,<NEXT_MAJOR, pins only in the locks"
        versions = sorted(tested.get(lock.normal(requirement.name), ()))
        if lock.normal(requirement.name) not in TESTED_ELSEWHERE:
            assert versions, f"{requirement}: no environment here installs it"
            bound = specs[">="].release
            assert versions[0].release[:len(bound)] == bound, (
                f"{requirement}: the oldest version tested here is {versions[0]}: make it the lower bound, or test it")
        newest = versions[-1] if versions else specs[">="]
        assert specs["<"].release == (newest.major + 1,), f"{requirement}: the next major after {newest}"


def test_the_extras_install_beside_the_newest_releases_without_changing_any(tmp_path):
    """A user's project that has today's releases (environments/newest.txt: the newest release of every direct
    dependency, as `make newest` last found them) installs the `trl` extra, and all of `all`'s, without pip changing
    any of them. A dry run of pip in a venv holding those releases (their metadata: what pip's resolver reads), with
    no index and no configuration: anything it would change instead fails it, named."""
    newest = lock.read_lock(REPO / "environments" / "newest.txt")
    venv = tmp_path / "project"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True)
    site = venv / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    for name, version in newest.items():
        info = site / f"{name.replace('-', '_')}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")} | {"PIP_CONFIG_FILE": os.devnull}
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    for extra in ("trl", "all"):
        wanted = extras_of(project["dependencies"] + [f"nbhelpers[{extra}]"])
        assert {lock.normal(Requirement(r).name) for r in wanted} <= set(newest), f"newest.txt lacks some of {wanted}"
        report = tmp_path / f"{extra}.json"
        done = subprocess.run([sys.executable, "-m", "pip", "--python", venv / "bin" / "python", "install", "--dry-run",
                               "--no-index", "--quiet", "--report", report, *wanted], capture_output=True, text=True,
                              env=env, timeout=120)
        assert done.returncode == 0, f".[{extra}] beside the newest releases: {done.stderr[-2000:]}"
        changed = [(i["metadata"]["name"], i["metadata"]["version"]) for i in json.loads(report.read_text())["install"]]
        assert not changed, f".[{extra}] would change {changed}"


def test_gpu_system_metrics_have_their_nvml_binding_declared():
    assert any(r.name == "nvidia-ml-py" for r in requirements()), "without it GPU metrics come back empty"
    import pynvml  # noqa: F401  (what MLflow and nbhelpers.launch.system_metrics read GPUs with)


def test_jupyterlab_opens_after_the_documented_install():
    readme = (REPO / "README.md").read_text()
    assert "make setup EXTRAS=jupyter" in readme and ".venv/bin/jupyter lab" in readme
    version = subprocess.run([BIN / "jupyter", "lab", "--version"], capture_output=True, text=True, check=True)
    assert re.fullmatch(r"4\.\d+\.\d+\s*", version.stdout), version.stdout


def test_make_setup_installs_from_the_locks(tmp_path):
    plan = subprocess.run(["make", "-n", "setup", "setup-axolotl", "setup-unsloth", "setup-air", "EXTRAS=jupyter",
                           f"VENV={tmp_path / 'venv'}", f"AXOLOTL_VENV={tmp_path / 'ax'}", f"UNSLOTH_VENV={tmp_path / 'un'}",
                           f"AIR_VENV={tmp_path / 'air'}"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    installs = [line for line in plan.splitlines() if " -m pip install " in line]
    assert len(installs) == 11, plan  # pip, torch and the rest in each venv (the CLI's has no torch)
    folders = {"/ax/": "environments/axolotl/", "/un/": "environments/unsloth/", "/air/": "environments/databricks-air/"}
    for line in installs:
        where = next((lock_dir for venv, lock_dir in folders.items() if venv in line), "")
        assert f"-c {where}constraints.txt" in line, line
    # this make's TORCH is the default one: the pins of its build are taken too (the quickstart's 2.13.0 has none)
    assert "-c constraints-torch.txt" in next(line for line in installs if '-e ".[jupyter]"' in line)
    user_torch = subprocess.run(["make", "-n", "setup", "TORCH=torch==2.11.0", f"VENV={tmp_path / 'venv'}"], cwd=REPO,
                                capture_output=True, text=True, check=True).stdout
    assert "constraints-torch.txt" not in user_torch, user_torch  # a GPU machine's own torch brings its own build


def test_the_readmes_cuda_install_line_names_the_index_and_the_driver():
    readme = (REPO / "README.md").read_text()
    line = next(line for line in readme.splitlines() if "download.pytorch.org/whl/cu" in line)
    assert "--index-url https://download.pytorch.org/whl/cu130" in line
    assert "driver" in readme[readme.index(line) - 400:readme.index(line) + 400]
