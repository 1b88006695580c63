"""notebooks/02_fast_steps.ipynb on 2 CPU processes and on one (its cases in notebook_cases.py): every knob row is
measured, and each throughput counts all ranks' tokens of the timed steps over rank 0's seconds of them."""
from types import SimpleNamespace

import pytest
import standins
import torch
import torch.distributed as dist
from transformers import AutoModelForCausalLM

from harness import assert_case_passes, case_ids
from notebook_cases import CASES
from notebook_code import notebook_cells

NOTEBOOK = "notebooks/02_fast_steps.ipynb"
MINE = [c for c in CASES if c.notebook == NOTEBOOK]

pytestmark = pytest.mark.notebook


@pytest.fixture(scope="module")
def metrics(notebook_run):
    return notebook_run(MINE[0])[0]


@pytest.mark.parametrize("case", MINE, ids=case_ids(MINE))
def test_notebook_meets_its_expectations(case, notebook_run):
    assert_case_passes(case, notebook_run)


def test_every_knob_is_measured_with_two_ranks(metrics):
    assert [k["change"] for k in metrics["knobs"]] == [
        "baseline (FSDP2, bf16, eager)", "fp32 instead of bf16", "activation checkpointing", "2x batch size",
        "FSDP2 reshard_after_forward=False", "DDP instead of FSDP2", "DataLoader: 0 workers, pageable memory",
        "torch.compile"]
    assert all(k["fits"] for k in metrics["knobs"]), metrics["knobs"]  # no row ran out of memory here


def test_each_rows_throughput_counts_every_ranks_tokens_of_its_timed_steps(metrics):
    # tokens/s is all ranks' tokens of the timed steps over rank 0's seconds of them: 2 steps x 2 ranks x the row's
    # batch x 64 tokens. Counting one rank's tokens, or the warm-up's seconds, fails this.
    for k in metrics["knobs"]:
        batch = 2 * 2 if k["change"] == "2x batch size" else 2
        assert k["tokens_per_s"] * k["timed_s"] == pytest.approx(2 * 2 * batch * 64, rel=1e-6), k


def test_the_profiled_throughput_counts_the_timed_steps(metrics):
    assert metrics["tokens_per_s"] * metrics["timed_s"][0] == pytest.approx(2 * 2 * 2 * 64, rel=1e-6), metrics


@pytest.mark.parametrize("checkpointing", [False, True])
def test_the_checkpointing_row_recomputes_each_layer_in_the_backward(checkpointing, tmp_path):
    """The row must change what it names: its model, loaded as the notebook loads it (from_pretrained gives eval
    mode, where Transformers skips checkpointing), runs each layer's attention again in the backward."""
    prepare = notebook_cells(NOTEBOOK, "prepare")["prepare"]
    model = AutoModelForCausalLM.from_pretrained(standins.make("llama-3.2-1b", "tiny", out=tmp_path / "model"))
    cfg = SimpleNamespace(activation_checkpointing=checkpointing, torch_compile=False, fsdp=True, bf16=False,
                          reshard_after_forward=True)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        model = prepare(model, cfg, torch.device("cpu"))
        calls = []
        model.model.layers[0].self_attn.register_forward_pre_hook(lambda *_: calls.append(1))
        ids = torch.randint(model.config.vocab_size, (2, 16))
        model(input_ids=ids, labels=ids).loss.backward()
    finally:
        dist.destroy_process_group()
    assert len(calls) == (2 if checkpointing else 1), f"attention ran {len(calls)} time(s) in one step"
