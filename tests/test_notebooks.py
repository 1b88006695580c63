"""Papermill runs of every notebook with the smoke parameters of notebook_cases.py."""
import os

import pytest

from harness import REPO, check_expectations, output_text
from notebook_cases import CASES


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


@pytest.mark.notebook
@pytest.mark.parametrize("case", CASES, ids=[_case_id(c) for c in CASES])
def test_notebook_meets_its_expectations(case, notebook_run):
    if case.gpu_only and not _has_gpu():
        pytest.skip(f"needs a GPU: {case.gpu_only} (GPU evidence: benchmarks/results/)")
    before = _files_in_the_repo()
    metrics, executed, _ = notebook_run(case)
    written = sorted(os.path.relpath(p, REPO) for p in _files_in_the_repo() - before)
    assert not written, f"{case.notebook} wrote into the repository instead of output_dir: {written[:5]}"
    failures = check_expectations(case, metrics)
    assert not failures, f"{case.notebook}: " + "; ".join(failures)
    text = output_text(executed)
    for expected in case.output_contains:
        assert expected in text, f"{case.notebook}: its outputs do not show {expected!r}"
