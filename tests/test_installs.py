"""Installs a user can reproduce (issue 29 §2): the extras and lower bounds of pyproject.toml, constraints.txt, the
README's install lines and JupyterLab."""
import re
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version

from harness import REPO

BIN = Path(sys.executable).parent


def constraints() -> dict:
    pins = {}
    for line in (REPO / "constraints.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            name, version = line.split("==")
            pins[name.lower().replace("_", "-")] = version
    return pins


def requirements() -> list[Requirement]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    listed = project["dependencies"] + [r for extra in project["optional-dependencies"].values() for r in extra]
    return [Requirement(r) for r in listed if not r.startswith("nbhelpers")]


def test_this_environment_is_the_one_constraints_txt_pins():
    differ = {}
    for name, pinned in constraints().items():
        try:
            installed = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
        if installed != pinned:
            differ[name] = (pinned, installed)
    assert not differ, f"constraints.txt and the tested environment differ (pinned, installed): {differ}; regenerate it"


# Bounds tested in another environment: torch 2.11 and torchvision 0.26 on the H200s (benchmarks/results),
# flash-linear-attention and causal-conv1d only there (CUDA only), nvidia-ml-py 12.560 in .venv-axolotl (Axolotl pins it).
TESTED_ELSEWHERE = {"torch", "torchvision", "flash-linear-attention", "causal-conv1d", "nvidia-ml-py"}


def test_every_lower_bound_is_the_tested_version():
    for requirement in requirements():
        for spec in requirement.specifier:
            if spec.operator == ">=" and requirement.name.lower() not in TESTED_ELSEWHERE:
                tested = Version(metadata.version(requirement.name))
                assert tested in requirement.specifier, f"{requirement}: tested with {tested}"
                bound = Version(spec.version).release
                assert tested.release[:len(bound)] == bound, (
                    f"{requirement}: the lower bound is older than what was tested ({tested}): raise it or test it")


def test_gpu_system_metrics_have_their_nvml_binding_declared():
    assert any(r.name == "nvidia-ml-py" for r in requirements()), "without it GPU metrics come back empty"
    import pynvml  # noqa: F401  (what MLflow and nbhelpers.launch.system_metrics read GPUs with)


def test_jupyterlab_opens_after_the_documented_install():
    readme = (REPO / "README.md").read_text()
    assert "make setup EXTRAS=jupyter" in readme and ".venv/bin/jupyter lab" in readme
    version = subprocess.run([BIN / "jupyter", "lab", "--version"], capture_output=True, text=True, check=True)
    assert re.fullmatch(r"4\.\d+\.\d+\s*", version.stdout), version.stdout


def test_make_setup_installs_from_the_constraints_file(tmp_path):
    plan = subprocess.run(["make", "-n", "setup", "EXTRAS=jupyter", f"VENV={tmp_path / 'venv'}"], cwd=REPO,
                          capture_output=True, text=True, check=True).stdout
    install = [line for line in plan.splitlines() if '-e ".[jupyter]"' in line]
    assert install and "-c constraints.txt" in install[0], plan


def test_the_readmes_cuda_install_line_names_the_index_and_the_driver():
    readme = (REPO / "README.md").read_text()
    line = next(line for line in readme.splitlines() if "download.pytorch.org/whl/cu" in line)
    assert "--index-url https://download.pytorch.org/whl/cu130" in line
    assert "driver" in readme[readme.index(line) - 400:readme.index(line) + 400]
