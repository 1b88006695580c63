"""Papermill runs of every notebook with the smoke parameters of notebook_cases.py."""
import pytest

from harness import check_expectations, output_text, run_case
from notebook_cases import CASES


def _has_gpu() -> bool:
    import torch

    return torch.cuda.device_count() > 0


def _case_id(case) -> str:
    name = case.notebook.removeprefix("notebooks/")
    return name if case.parameters.get("num_gpus") is None else f"{name}-num_gpus={case.parameters['num_gpus']}"


@pytest.mark.notebook
@pytest.mark.parametrize("case", CASES, ids=[_case_id(c) for c in CASES])
def test_notebook_meets_its_expectations(case, tmp_path_factory, standin):
    if case.gpu_only and not _has_gpu():
        pytest.skip(f"needs a GPU: {case.gpu_only} (GPU evidence: benchmarks/results/)")
    metrics, executed, _, written = run_case(case, tmp_path_factory, standin)  # other tests may reuse this run
    assert not written, f"{case.notebook} wrote into the repository instead of output_dir: {written[:5]}"
    failures = check_expectations(case, metrics)
    assert not failures, f"{case.notebook}: " + "; ".join(failures)
    text = output_text(executed)
    for expected in case.output_contains:
        assert expected in text, f"{case.notebook}: its outputs do not show {expected!r}"
