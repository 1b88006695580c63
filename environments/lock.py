"""Write the lock of each environment the Makefile installs: `make lock` (keep what is locked, resolve what is new),
`make lock UPGRADE=1` (the newest releases, holds kept), or `python environments/lock.py [--upgrade] [ENV ...]`.

A lock pins every distribution the environment's install brings, so a release elsewhere cannot change what a fresh
clone installs. Two files per environment: the lock, and beside it the pins that come with the Makefile's default torch
(its CUDA build's libraries, Triton, packages built for that one torch), which `make setup` adds only when TORCH is not
given on the command line (a GPU machine's own torch brings its own).

The resolver is pip's own (`pip install --dry-run --ignore-installed --report`): the installer `make setup` uses, with
the same configuration (the local wheel of torch, indexes), and nothing more to install. uv's resolver does not read
pip's configuration nor the local wheels; pip-tools would be one more tool to pin. The one environment shared by two
locks, the MLflow store (`runs/mlflow.db`), is held to the main lock's versions in the other environments: both
environments write it, and MLflow refuses a store that another version migrated.
"""
from __future__ import annotations

import argparse
import datetime
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# What comes with a torch build: pinned only with the Makefile's default TORCH.
TORCH_BUILD = re.compile(r"^(torch|torchvision|torchaudio|triton|xformers|torchao|cuda-.*|nvidia-(?!ml-py$).*)$")
# The packages of the one MLflow store every environment writes.
SHARED_STORE = ("mlflow", "mlflow-skinny", "mlflow-tracing", "sqlalchemy", "alembic")
# Held back: name -> (version, why). Written beside the pin, kept by --upgrade.
HOLDS = {
    "main": {
        # From 4.25 its format checks import rfc3987-syntax (jupyter-events asks for them), which builds about 30
        # Earley parsers at import: on a loaded 2-core machine a raylet gave up waiting for its agent.
        "jsonschema": ("4.24.0", "4.25+ spends 3.4 CPU-s importing rfc3987-syntax in every Ray and nbformat process "
                                 "(benchmarks/README.md)"),
    },
}
ENVIRONMENTS = {
    # name: (what is installed (pip and setuptools: a venv has them before anything is installed), the Makefile variable of its torch pin, the lock, the main lock's store pins?)
    "main": (["pip", "setuptools", "-e", ".[all]"], "TORCH", "constraints.txt", False),
    "axolotl": (["pip", "setuptools", "-r", "environments/axolotl/requirements.txt", "-e", "."], "AXOLOTL_TORCH",
                "environments/axolotl/constraints.txt", True),
    "unsloth": (["pip", "setuptools", "-r", "environments/unsloth/requirements.txt", "-e", ".[unsloth]"],
                "UNSLOTH_TORCH", "environments/unsloth/constraints.txt", True),
    "databricks-air": (["pip", "setuptools", "-r", "environments/databricks-air/requirements.txt"], None,
                       "environments/databricks-air/constraints.txt", False),
}


def normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def read_lock(path: Path) -> dict[str, str]:
    """{normalised name: version} of a lock (or of any file of `name==version` lines; comments ignored)."""
    if not path.is_file():
        return {}
    pins = re.findall(r"^([A-Za-z0-9_.-]+)==([^\s#;]+)", path.read_text(), flags=re.MULTILINE)
    return {normal(name): version for name, version in pins}


def torch_lock(lock: Path) -> Path:
    return lock.with_name(lock.stem + "-torch.txt")


def makefile_value(variable: str) -> str:
    value = re.search(rf"^{variable} \?= (.*)$", (REPO / "Makefile").read_text(), flags=re.MULTILINE)
    return value.group(1).strip()


def resolve(install: list[str], constraints: list[str]) -> list[dict]:
    """pip's resolution of `install` under `constraints` (lines): the report's `install` entries."""
    with tempfile.TemporaryDirectory() as scratch:
        pinned = Path(scratch, "constraints.txt")
        pinned.write_text("\n".join(constraints) + "\n")
        report = Path(scratch, "report.json")
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--dry-run", "--ignore-installed",
                        "--report", str(report), "-c", str(pinned), *install], cwd=REPO, check=True)
        return json.loads(report.read_text())["install"]


def lock(name: str, upgrade: bool) -> None:
    install, torch_variable, lock_name, shares_store = ENVIRONMENTS[name]
    path = REPO / lock_name
    holds = HOLDS.get(name, {})
    torch_pins = makefile_value(torch_variable).split() if torch_variable else []
    constraints = [f"{n}=={v}" for n, (v, _) in holds.items()] + torch_pins
    if shares_store:
        main = read_lock(REPO / ENVIRONMENTS["main"][2])
        constraints += [f"{n}=={main[n]}" for n in SHARED_STORE if n in main]
    if not upgrade:  # keep what is locked; only what is new is resolved
        kept = {**read_lock(path), **read_lock(torch_lock(path))}
        named = {normal(re.split(r"[=<>!~ ]", c)[0]) for c in constraints}
        constraints += [f"{n}=={v}" for n, v in kept.items() if n not in named]
    resolved = resolve(install + torch_pins, constraints)
    pins = {}
    for entry in resolved:
        metadata = entry["metadata"]
        if entry.get("is_direct") and entry["download_info"].get("dir_info", {}).get("editable"):
            continue  # this project itself
        pins[metadata["name"]] = metadata["version"].split("+")[0]  # torch 2.13.0+cpu: the local build's label goes
    today = datetime.date.today().isoformat()
    command = f"python environments/lock.py {name}   (make lock; --upgrade / UPGRADE=1: the newest releases)"
    plain = {n: v for n, v in pins.items() if not TORCH_BUILD.match(normal(n))}
    built = {n: v for n, v in pins.items() if TORCH_BUILD.match(normal(n))}
    header = [f"# The lock of the {name} environment: every distribution its install brings, resolved by pip on "
              f"{today} (Python {sys.version_info.major}.{sys.version_info.minor}).",
              f"# Regenerate: {command}"]
    if torch_variable:
        header.append(f"# What comes with the default torch pin is in {torch_lock(path).name} beside this file.")
    if shares_store:
        header.append("# MLflow, SQLAlchemy and alembic are the main lock's (constraints.txt): one MLflow store for "
                      "every environment.")
    lines = [f"{n}=={v}" + (f"  # held back: {holds[normal(n)][1]}" if normal(n) in holds else "")
             for n, v in sorted(plain.items(), key=lambda item: normal(item[0]))]
    path.write_text("\n".join(header + lines) + "\n")
    print(f"{lock_name}: {len(plain)} pins")
    if not torch_variable:
        return
    torch_header = [f"# What the {name} environment installs with the Makefile's default "
                    f"{torch_variable} ({' '.join(torch_pins)}): the torch build and what comes "
                    "with it.", "# `make setup` adds it only when that pin is not given on the command line. "
                    f"Regenerate: {command}"]
    torch_lock(path).write_text("\n".join(torch_header + [f"{n}=={v}" for n, v in sorted(
        built.items(), key=lambda item: normal(item[0]))]) + "\n")
    print(f"{torch_lock(path).name}: {len(built)} pins")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("environments", nargs="*", metavar="ENV", help=f"which locks to write: {', '.join(ENVIRONMENTS)} "
                        "(default: all; the main one first: the others take its MLflow)")
    parser.add_argument("--upgrade", action="store_true", help="the newest releases (holds kept), not the locked ones")
    args = parser.parse_args()
    unknown = set(args.environments) - set(ENVIRONMENTS)
    if unknown:
        parser.error(f"no environment {', '.join(sorted(unknown))}: the environments are {', '.join(ENVIRONMENTS)}")
    for name in sorted(args.environments or ENVIRONMENTS, key=lambda n: n != "main"):
        lock(name, args.upgrade)


if __name__ == "__main__":
    main()
