"""Papermill runs of every notebook with the smoke parameters of notebook_cases.py."""
import pytest

from harness import check_expectations, output_text, run_notebook
from notebook_cases import CASES


def _has_gpu() -> bool:
    import torch

    return torch.cuda.device_count() > 0


@pytest.mark.notebook
@pytest.mark.parametrize("case", CASES, ids=[c.notebook.removeprefix("notebooks/") for c in CASES])
def test_notebook_meets_its_expectations(case, tmp_path, standin):
    if case.gpu_only and not _has_gpu():
        pytest.skip(f"needs a GPU: {case.gpu_only} (GPU evidence: benchmarks/results/)")
    metrics, executed = run_notebook(case, tmp_path, standin)
    failures = check_expectations(case, metrics)
    assert not failures, f"{case.notebook}: " + "; ".join(failures)
    text = output_text(executed)
    for expected in case.output_contains:
        assert expected in text, f"{case.notebook}: its outputs do not show {expected!r}"
