"""The drift check, `make newest`: do the notebooks still run on the newest release of everything they use?

It builds a throwaway venv with the newest release of every direct dependency of the main environment (the names in
pyproject.toml's dependencies and the extras of `all`, without their version ranges: pip takes the newest releases that
go together; torch is the Makefile's pin, never an unpinned CUDA build), installs this project without its dependencies,
says which releases differ from the lock (constraints.txt) and whether the project's ranges would change any of them,
then runs each notebook's smoke cases (tests/notebook_cases.py) there, hermetically as `make test` does, and prints what
fails. The Unsloth and Axolotl notebooks run on their own environments' kernels, whose locks their frameworks fence:
`make test` covers them. Not part of CI: a release elsewhere must not turn a submission red.

It writes environments/newest.txt: the date, the releases it found and what passed (tests/test_installs.py checks that
the extras install beside those releases without pip changing any of them). README's "Tested with" line quotes it.

    python environments/newest.py [--keep] [--workers N] [PYTEST_ARGS...]
"""
from __future__ import annotations

import argparse
import datetime
import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import lock  # noqa: E402  the locks' reader, the Makefile's torch pin

REPO = lock.REPO
NEWEST = REPO / "environments" / "newest.txt"
# The notebooks whose kernels are environments of their own (their locks: environments/unsloth, environments/axolotl)
OWN_KERNELS = ("unsloth", "axolotl")
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1", "AXOLOTL_DO_NOT_TRACK": "1",
           "RAY_USAGE_STATS_ENABLED": "0"}


def direct_dependencies() -> list[str]:
    """The main environment's direct dependencies, names only (with their extras, e.g. ray[train]): pyproject's
    dependencies and those of the extras `all` brings."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    extras, wanted, names = project["optional-dependencies"], ["all"], []
    requirements = list(project["dependencies"])
    while wanted:
        for requirement in extras[wanted.pop()]:
            if requirement.startswith("nbhelpers["):
                wanted += requirement[len("nbhelpers["):-1].split(",")
            else:
                requirements.append(requirement)
    for requirement in requirements:
        name = re.match(r"[A-Za-z0-9_.-]+(\[[^]]*\])?", requirement).group(0)
        if lock.normal(name) not in {lock.normal(n) for n in names}:
            names.append(name)
    return names


def pip(python: Path, *args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([str(python), "-m", "pip", *args], cwd=REPO, check=True, **kw)


def installed_versions(python: Path) -> dict[str, str]:
    listing = subprocess.run([str(python), "-c", "from importlib import metadata; [print(d.metadata['Name'], d.version)"
                              " for d in metadata.distributions()]"], capture_output=True, text=True, check=True)
    return {lock.normal(line.split()[0]): line.split()[1] for line in listing.stdout.splitlines()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keep", action="store_true", help="keep the venv (its path is printed)")
    parser.add_argument("--workers", type=int, default=3, help="pytest-xdist workers (as `make test`'s TEST_WORKERS)")
    parser.add_argument("pytest_args", nargs="*", help="other pytest arguments (default: every notebook smoke case)")
    args = parser.parse_args()
    started = datetime.datetime.now()
    scratch = Path(tempfile.mkdtemp(prefix="cookbook-newest-"))
    venv, python = scratch / "venv", scratch / "venv" / "bin" / "python"
    try:
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        torch = lock.makefile_value("TORCH").split()
        (scratch / "torch-pin.txt").write_text("\n".join(torch) + "\n")
        names = direct_dependencies()
        print(f"newest: a venv in {venv}: {' '.join(torch)} (the Makefile's pin), then the newest release of "
              f"{len(names)} direct dependencies: {' '.join(names)}", flush=True)
        pip(python, "install", "-q", "--upgrade", "pip", "setuptools")
        pip(python, "install", "-q", *torch)
        pip(python, "install", "-q", "-c", str(scratch / "torch-pin.txt"), *names)
        pip(python, "install", "-q", "--no-deps", "--no-build-isolation", "-e", ".")
        here = installed_versions(python)
        locked = lock.read_lock(REPO / "constraints.txt") | lock.read_lock(REPO / "constraints-torch.txt")
        found = {lock.normal(n.split("[")[0]): here.get(lock.normal(n.split("[")[0])) for n in names}
        newer = {n: (locked.get(n), v) for n, v in found.items() if locked.get(n) != v}
        print("\nnewest: the releases that differ from the lock (constraints.txt): "
              + (", ".join(f"{n} {old} -> {new}" for n, (old, new) in sorted(newer.items())) or "none"))
        # What the project's ranges (pyproject.toml) would change: a dry run of its install with every extra of `all`,
        # from nothing but what is installed (anything else it would need fails it, named)
        dry = subprocess.run([str(python), "-m", "pip", "install", "--dry-run", "-q", "--no-index",
                              "--no-build-isolation", "-e", ".[all]"], cwd=REPO, capture_output=True, text=True)
        changes = [line for line in dry.stderr.splitlines() if line.startswith("ERROR")] if dry.returncode else []
        checked = subprocess.run([str(python), "-m", "pip", "check"], capture_output=True, text=True)
        conflicts = changes + [line for line in checked.stdout.splitlines() if line.strip() and "No broken" not in line]
        print("newest: `pip install -e .[all]` beside them and pip check: " + ("; ".join(conflicts) if conflicts else
              "nothing would change, every requirement is met"), flush=True)

        # every notebook's smoke cases, as make test runs tests: fresh TMPDIR and HOME, offline
        (scratch / "tmp").mkdir()
        (scratch / "home").mkdir()
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        env |= OFFLINE | {"TMPDIR": str(scratch / "tmp"), "HOME": str(scratch / "home")}
        selection = args.pytest_args or ["tests/", "-k", "test_notebook_meets_its_expectations and not "
                                          + " and not ".join(OWN_KERNELS)]
        run = subprocess.run([str(python), "-m", "pytest", "-p", "no:cacheprovider", "-n", str(args.workers),
                              "--dist", "loadfile", "-q", "-rfE", "--no-header", "-o", "addopts=", *selection],
                             cwd=REPO, env=env, capture_output=True, text=True)
        print(run.stdout[-20000:])
        # pytest's last line: "21 passed, 3 warnings in 283.34s (0:04:43)" (-q), between rows of "=" otherwise
        summary = (re.findall(r"^=* ?(\d+ (?:passed|failed|errors?|skipped|deselected)\b.* in [0-9.]+s.*?) ?=*$",
                              run.stdout, flags=re.MULTILINE) or [f"pytest exited {run.returncode}"])[-1]
        if run.returncode and summary.startswith("pytest exited"):
            print(run.stderr[-3000:])
        failing = sorted(set(re.findall(r"^(?:FAILED|ERROR) (\S+)", run.stdout, flags=re.MULTILINE)))
        minutes = (datetime.datetime.now() - started).total_seconds() / 60
        print(f"newest: {summary} ({minutes:.0f} min in all)"
              + ("".join(f"\n  failed: {name}" for name in failing) if failing else ""))
        NEWEST.write_text("\n".join([
            f"# The drift check (make newest, environments/newest.py) on {started.date().isoformat()}: the newest "
            f"release of every direct dependency of the main environment, {' '.join(torch)} (the Makefile's pin).",
            "# Releases that differ from the lock (constraints.txt): "
            + (", ".join(f"{n} {old} -> {new}" for n, (old, new) in sorted(newer.items())) or "none"),
            f"# Each notebook's smoke cases there (all but Unsloth's and Axolotl's, on their own kernels): {summary}"
            + (f"; failed: {', '.join(failing)}" if failing else ""),
            "# `pip install -e .[all]` beside them and pip check: " + ("; ".join(conflicts) if conflicts else
                                                                       "nothing would change, every requirement met"),
            *[f"{n}=={v}" for n, v in sorted(found.items()) if v]]) + "\n")
        print(f"newest: wrote {NEWEST.relative_to(REPO)}")
        return run.returncode
    finally:
        if args.keep:
            print(f"newest: the venv is kept: {venv}")
        else:
            shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
