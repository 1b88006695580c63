"""nbhelpers.planner.time_to_finish (issue 61): the time to finish before a run starts, from the cookbook's measured
MFU. The arithmetic, the nearest measured run, the wording of the planner's line and CLI, and the shipped table against
what benchmarks/mfu_table.py makes from benchmarks/results now. CPU only: models on the meta device."""
from __future__ import annotations

import importlib.util
import re
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from nbhelpers.planner import fits
from nbhelpers.planner.command_line import main
from nbhelpers.planner.flops import flops_per_token
from nbhelpers.planner.parameters import load_model
from nbhelpers.planner.time_to_finish import (TABLE, Measured, Workload, duration, gpu_type, load_table, model_family,
                                              nearest, time_to_finish, tokens_to_train)

REPO = Path(__file__).resolve().parents[1]
PEAK = 989e12  # H100 and H200, dense bf16


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location("mfu_table", REPO / "benchmarks" / "mfu_table.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["mfu_table"] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def llama():
    return load_model("llama-3.2-1b")


def measured(**changes) -> Measured:
    row = Measured(model="llama-3.2-1b", layers=16, framework="pytorch", variant="", fine_tune="full", technique="fsdp",
                   compiled=False, checkpointing=False, data="full rows", micro_batch=4, seq_len=2048, gpu="H100",
                   gpus=1, tokens_per_s_per_gpu=0.0, flops_per_token=0.0, mfu=0.30, run="a/run", date="2026-12-07")
    return replace(row, **changes)


def table(*rows, efficiency=0.9, default=0.1) -> dict:
    return {"runs": list(rows), "two_gpu_efficiency": efficiency, "default_mfu": default}


def test_tokens_are_the_steps_global_batch_of_full_sequences_or_the_data_sets_tokens_times_epochs():
    assert tokens_to_train(max_steps=983, per_device_train_batch_size=1, gpus=32, seq_len=8192) == 983 * 32 * 8192
    assert tokens_to_train(max_steps=10, per_device_train_batch_size=4, gradient_accumulation_steps=4, gpus=2,
                           seq_len=2048) == 10 * 4 * 4 * 2 * 2048
    assert tokens_to_train(max_steps=-1, per_device_train_batch_size=4, gpus=1, seq_len=2048, dataset_tokens=10**6,
                           num_train_epochs=3) == 3 * 10**6  # max_steps -1: epochs, as the Trainer does
    assert tokens_to_train(max_steps=-1, per_device_train_batch_size=4, gpus=1, seq_len=2048) is None


def test_the_time_is_tokens_times_flops_per_token_over_gpus_peak_and_mfu(llama):
    tokens = 10**9
    one = time_to_finish(llama, "fsdp", gpus=1, gpu="H100", seq_len=2048, tokens=tokens, micro_batch=4,
                         table=table(measured()))
    flops = flops_per_token(llama[1], 2048)
    assert one.seconds == pytest.approx(tokens * flops / (PEAK * 0.30))
    assert one.seconds_per_step == pytest.approx(4 * 2048 * flops / (PEAK * 0.30))
    eight = time_to_finish(llama, "fsdp", gpus=8, gpu="H100", seq_len=2048, tokens=tokens, micro_batch=4,
                           price_per_gpu_hour=2.0, table=table(measured()))
    assert eight.mfu == pytest.approx(0.30 * 0.9)  # measured on 1 GPU: the 2-GPU efficiency per GPU
    assert eight.seconds == pytest.approx(tokens * flops / (8 * PEAK * 0.27))
    assert eight.gpu_hours == pytest.approx(8 * eight.seconds / 3600)
    assert eight.cost == pytest.approx(2 * eight.gpu_hours)
    two = time_to_finish(llama, "fsdp", gpus=2, gpu="H100", seq_len=2048, tokens=tokens, table=table(measured(gpus=2)))
    assert two.mfu == pytest.approx(0.30)  # measured on 2 GPUs: as measured


def test_the_nearest_run_is_the_same_model_and_framework_then_data_fine_tune_compile_checkpointing_technique_code():
    want = Workload("llama-3.2-1b", 16, "full", "fsdp", "H100", 1, 2048, 4, False, False, "pytorch")
    eager, compiled = measured(run="eager"), measured(compiled=True, run="compiled")
    assert nearest(want, [compiled, eager]) == [eager]
    older = measured(variant="the notebook of 2026-11-30", run="older")
    assert nearest(want, [compiled, older]) == [older]  # the setting matters before the code's history
    assert nearest(want, [measured(framework="trl", run="trl"), compiled]) == [compiled]
    assert nearest(replace(want, model="qwen3-8b"), [eager]) == []
    assert nearest(replace(want, framework="unsloth"), [eager]) == []  # a framework given must have run it
    short = measured(data="short rows, padded", run="short")  # tokens/s of rows far below max_length
    assert nearest(want, [short]) == [] and nearest(replace(want, data="short rows, padded"), [short, eager]) == [short]
    deeper = measured(layers=12, run="12 layers")
    assert nearest(replace(want, layers=64), [measured(layers=4, run="4 layers"), deeper]) == [deeper]
    h200 = measured(gpu="H200", run="h200")
    assert nearest(want, [h200, measured(seq_len=4096, run="4096")]) == [h200]  # the length before the card


def test_equally_near_runs_give_their_median(llama):
    runs = [measured(mfu=m, run=f"r{m}") for m in (0.2, 0.3, 0.5)]
    estimate = time_to_finish(llama, "fsdp", gpus=1, gpu="H100", seq_len=2048, tokens=10**6, micro_batch=4,
                              table=table(*runs))
    assert estimate.mfu == pytest.approx(0.3) and len(estimate.measured) == 3
    assert "median of 3 runs, e.g. r0.2" in str(estimate)


def test_the_wording_names_the_run_and_what_is_assumed_beyond_it(llama):
    kwargs = dict(technique="fsdp", gpu="H100", seq_len=2048, micro_batch=4, table=table(measured(run="h100x1/x")))
    flops = flops_per_token(llama[1], 2048)
    hour_and_ten = (70 * 60) * PEAK * 0.30 / flops  # tokens that take 70 minutes on one GPU
    said = str(time_to_finish(llama, gpus=1, tokens=hour_and_ten, **kwargs))
    assert said == "about 1 h 10 min on 1 x H100 at 30 % MFU (measured: h100x1/x)"
    said = str(time_to_finish(llama, gpus=2, tokens=hour_and_ten, **kwargs))
    assert said.startswith("about 39 min (1.3 GPU-hours) on 2 x H100 at 27 % MFU (measured on 1 x H100: h100x1/x; "
                           "2 GPUs at 90 % of one GPU's speed each, as measured on 2)")
    said = str(time_to_finish(llama, gpus=32, tokens=hour_and_ten, price_per_gpu_hour=3, **kwargs))
    assert "32 GPUs at 90 % of one GPU's speed each, as measured on 2, assumed beyond 2" in said
    assert re.match(r"about 2 min \(1\.3 GPU-hours, cost 3\.89 at 3 per GPU-hour\) on 32 x H100", said), said
    said = str(time_to_finish(llama, gpus=1, tokens=None, **kwargs))
    assert re.match(r"about 0\.\d+ s a step on 1 x H100 at 30 % MFU \(measured: h100x1/x\)$", said), said
    said = str(time_to_finish(load_model("qwen3-0.6b"), gpus=1, tokens=10**6, framework="trl", **kwargs))
    assert said.endswith("at 10 % MFU (no measured run of qwen3-0.6b with trl: an assumed MFU, the lower quartile of "
                         "the cookbook's runs)")


def test_durations_and_names_read_as_people_write_them():
    assert [duration(s) for s in (4.27, 42, 14 * 60, 70 * 60, 50 * 3600)] == ["4.3 s", "42 s", "14 min", "1 h 10 min",
                                                                             "2.1 days"]
    assert gpu_type("NVIDIA H100 80GB HBM3") == "H100" and gpu_type("NVIDIA H200") == "H200"
    assert gpu_type("NVIDIA A10") is None
    assert model_family("openai/gpt-oss-20b") == "gpt-oss-20b" and model_family("Qwen/Qwen3.8-27B") == "qwen3.8-27b"
    assert model_family("/tmp/standins/llama-3.2-3b-full") == "llama-3.2-3b" and model_family("my-model") is None


def test_the_planners_line_ends_with_the_time_where_it_fits(monkeypatch, capsys):
    load_model("qwen2.5-3b")  # the first model built in a process: torch's warnings, not the planner's line
    capsys.readouterr()
    monkeypatch.setattr(fits, "visible_gpus", lambda: [("NVIDIA H100 80GB HBM3", 79.2)] * 8)
    fits.check_fits("qwen2.5-3b", "ddp", seq_len=1024, micro_batch=4, checkpointing=True, fused_adamw=True,
                    gradient_as_bucket_view=True, max_steps=100, gradient_accumulation_steps=2,
                    framework="pytorch", torch_compile=False)  # the Ray recipe's settings
    said = capsys.readouterr().err.strip().splitlines()
    assert len(said) == 1, said
    assert re.match(r"planner: qwen2\.5-3b \(full\) with DDP on 8 x 79\.2 GiB \(NVIDIA H100 80GB HBM3\), 4 x 1024 "
                    r"tokens per GPU, [^:]*checkpointing: about [\d.]+ GiB per GPU, fits \([\d.]+ GiB spare\); "
                    r"about [\d.]+ min \([\d.]+ GPU-hours\) on 8 x H100 at \d+ % MFU \(measured on 1 x H100: "
                    r"h100x1_2026-12-06/ray_recipes/qwen2_5_3b_1w_ckpt_metrics; 8 GPUs at 97 % of one GPU's speed "
                    r"each, as measured on 2, assumed beyond 2\)$", said[0]), said[0]
    monkeypatch.setattr(fits, "visible_gpus", lambda: [("NVIDIA A40", 44.4)])
    fits.check_fits("llama-3.2-1b", "ddp", seq_len=256, micro_batch=1, checkpointing=True, max_steps=10)
    assert capsys.readouterr().err.strip().endswith("; no time estimate: no peak FLOP/s known for NVIDIA A40")
    monkeypatch.setattr(fits, "visible_gpus", lambda: [])  # no GPU: the memory line as before, no time
    assert fits.check_fits("llama-3.2-1b", "ddp", max_steps=10) is None
    assert capsys.readouterr().err.strip() == ("planner: no GPU is visible, so there is no GPU memory to check "
                                               "(CPU processes)")


def test_the_command_line_gives_the_time_of_its_steps_with_the_recommended_technique(capsys):
    main(["qwen3.8-27b", "--gpus", "32", "--seq-len", "8192", "--checkpointing", "--linear-attention", "fla",
          "--fused-adamw", "--steps", "983", "--framework", "pytorch", "--price-per-gpu-hour", "3"])
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("time to finish with FSDP2 (ZeRO-3): about 1 h ") and "on 32 x H100 at" in last, last
    assert "per GPU-hour" in last and "assumed beyond 2" in last


def test_the_shipped_table_is_what_the_script_makes_from_benchmarks_results_now(script):
    made = script.make_table()
    assert script.table_text(made) == TABLE.read_text(), "run: .venv/bin/python benchmarks/mfu_table.py"
    shipped = load_table()
    assert len(shipped["runs"]) == len([run for run in script.RUNS if not run.not_counted])
    assert all(0 < row.mfu < 1 for row in shipped["runs"])


def test_every_run_with_tokens_per_s_in_benchmarks_results_is_listed(script):
    """A new results file with tokens/s must be listed (counted, or left out with its reason)."""
    listed = {run.file for run in script.RUNS}
    summaries = {"summary.json"}  # they repeat the runs' own files, except where a run has no file of its own
    found = set()
    for path in (REPO / "benchmarks" / "results").rglob("*.json"):
        text = path.read_text(errors="replace")
        if '"tokens_per_s' in text and path.name not in summaries and "adapter" not in path.parts:
            found.add(path.relative_to(REPO / "benchmarks" / "results").as_posix())
    assert found <= listed, sorted(found - listed)


def test_the_databricks_check_is_within_its_goal(script):
    check = script.databricks(load_table())
    assert abs(check["error"]) <= 0.25, check


def test_benchmarks_readme_shows_what_the_script_computes(script):
    readme = (REPO / "benchmarks" / "README.md").read_text()
    start, end = "<!-- made by benchmarks/mfu_table.py --markdown -->\n", "\n<!-- end of benchmarks/mfu_table.py -->"
    assert start in readme and end in readme
    shown = readme.split(start)[1].split(end)[0]
    assert shown == script.markdown(script.make_table()), "paste: .venv/bin/python benchmarks/mfu_table.py --markdown"
