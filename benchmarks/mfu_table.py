"""The measured speeds behind the time-to-finish estimate (nbhelpers/planner/time_to_finish.py), and its two checks.

Every GPU run of benchmarks/results with a tokens/s figure is listed below (RUNS) with what ran: model, depth,
framework, code, data, fine-tune, technique, torch.compile, checkpointing, micro-batch, sequence length, GPUs. What
the files record (tokens/s, the device) is read from them; what they do not record is written here from the results'
READMEs and the scripts that made them. A run is left out of the table only for a reason that says nothing of its speed
against the others (`not_counted`): the GPU or host shared with other runs, a profiled step, a tiny stand-in.

    .venv/bin/python benchmarks/mfu_table.py             # writes nbhelpers/planner/mfu_table.json, prints the checks
    .venv/bin/python benchmarks/mfu_table.py --markdown  # the checks as benchmarks/README.md shows them

The checks (issue 61), on a CPU (FLOPs per token from the models' configs on the meta device):
- leave-one-out: each counted run's time for its own tokens, estimated from the table without that run (and from the
  2-GPU efficiency of the pairs without it), against the time it took: error = estimated / measured - 1;
- Databricks' Qwen3.8-27B recipe: 983 steps of 32 x 8,192 tokens on 32 H100 in about 70 minutes of training.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from dataclasses import asdict, dataclass
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from nbhelpers.planner import model_configs  # noqa: E402
from nbhelpers.planner.flops import PEAK_BF16_FLOPS, flops_per_token  # noqa: E402
from nbhelpers.planner.time_to_finish import (  # noqa: E402
    FULL_ROWS, SHORT_ROWS, TABLE, Measured, Workload, nearest, scaled_mfu)

RESULTS = ROOT / "benchmarks" / "results"
SHORT = SHORT_ROWS  # the notebooks' small test sets: tokens/s counts real tokens, far below batch x max_length
SYNTHETIC = "synthetic"
SHARED = "the GPU or host shared with other runs (its results README says the speed is not clean)"
PROFILED = "profiled: torch.profiler slows the step"
TINY = "a tiny stand-in (a launch and NCCL check, recipes.md: it measures nothing)"


@dataclass(frozen=True)
class Run:
    file: str  # under benchmarks/results
    key: str  # where tokens/s (all GPUs together) is in the file: "tokens_per_s", "knobs.2.tokens_per_s", ...
    model: str
    layers: int
    framework: str
    fine_tune: str
    technique: str
    compiled: bool
    checkpointing: bool
    data: str
    micro_batch: int
    seq_len: int
    gpus: int = 1
    variant: str = ""
    not_counted: str = ""

    @property
    def gpu(self) -> str:
        return "H100" if self.file.startswith("h100") else "H200"  # the 2026-11-30 folders: 2 x H200

    @property
    def date(self) -> str:
        folder = self.file.split("/")[0]
        return folder.split("_")[1] if folder.startswith(("h100x1_", "h200x1_")) else "2026-11-30"

    @property
    def name(self) -> str:
        path = self.file.removesuffix(".json").removesuffix("/metrics")
        return path if self.key in ("tokens_per_s", "tokens_per_s.0") else f"{path}[{self.key}]"


# The fast-steps guide's runs and, in each, the knob of each row of its table (None: a row without tokens/s)
GUIDES = [("h200x1_2026-12-01/perfguide/metrics.json",
           ["baseline", "fp32", "checkpointing", "2x batch", "reshard", "DDP", "0 workers", "compile"]),
          ("h200x1_2026-12-02/call1_pytorch/performance_and_resilience.json",
           ["baseline", "fp32", "checkpointing", "2x batch", "0 workers", "compile"]),
          # the fp32 rows did not fit 80 GB (no tokens/s); the first checkpointing row ran without checkpointing (the
          # model was in eval mode, where Transformers skips it: benchmarks/README), so it is a baseline
          ("h100x1_2026-12-06/perfguide/02_fast_steps_metrics.json",
           ["baseline", None, "baseline", "2x batch", "0 workers", "compile"]),
          ("h100x1_2026-12-06/perfguide_02_checkpointing_fixed/02_fast_steps_metrics.json",
           ["baseline", None, "checkpointing", "2x batch", "0 workers", "compile"])]
GUIDE_RUNS = {file.removesuffix(".json").removesuffix("/metrics") for file, _ in GUIDES}


def _runs() -> list[Run]:
    runs = []

    def add(files, key="tokens_per_s", **settings):
        runs.extend(Run(f, key, **settings) for f in ([files] if isinstance(files, str) else files))

    # GPT-OSS-20B, the TRL notebook's LoRA (r=8) under DDP, gradient checkpointing
    gpt20 = dict(model="gpt-oss-20b", framework="trl", fine_tune="lora", technique="ddp", checkpointing=True)
    old = dict(gpt20, layers=8, micro_batch=16, seq_len=512, data=SHORT, compiled=False,
               variant="the notebook of 2026-11-30")  # trl.sh 2gpu_20b: 8 of 24 layers, batch 16, max_length 512
    add("trl/ddp_20b_1gpu/metrics.json", **old)
    add("trl/ddp_20b_2gpu/metrics.json", gpus=2, **old)
    add("trl/gpt_oss_20b_accum4/ddp_20b_1gpu/metrics.json", **old)
    add("trl/gpt_oss_20b_accum4/ddp_20b_2gpu/metrics.json", gpus=2, **old)
    add("h200x1_2026-12-01/trl/20b_1gpu/metrics.json", "tokens_per_s.0", layers=24, micro_batch=4, seq_len=2048,
        data=SHORT, compiled=False, variant="the notebook of 2026-12-01 (eager attention)", **gpt20)
    add("h200x1_2026-12-02/call2_llm_and_retinanet/gpt_oss_20b.json", "tokens_per_s.0", layers=24, micro_batch=4,
        seq_len=2048, data=SHORT, compiled=False, variant="the notebook of 2026-12-02", not_counted=SHARED, **gpt20)
    crossed = dict(gpt20, layers=24, micro_batch=4, seq_len=2048, data=FULL_ROWS,
                   variant="packed conversations attended to each other (before 2026-12-06)")
    add("h200x1_2026-12-04/gpt_oss_call1_speed/20b_eager_packed.json", compiled=False, **crossed)
    add("h200x1_2026-12-04/gpt_oss_call2_notebooks/20b_compiled_packed.json", compiled=True, **crossed)
    for compiled in (True, False):
        add(f"h200x1_2026-12-04/gpt_oss_call2_notebooks/nb_20b_{'compiled' if compiled else 'eager'}_metrics.json",
            "tokens_per_s.0", compiled=compiled, **crossed)
    today = dict(gpt20, layers=24, micro_batch=4, seq_len=2048, data=FULL_ROWS)
    add("h100x1_2026-12-06/gpt_oss_20b/20b_compiled_packed.json", compiled=True, **today)
    add("h100x1_2026-12-06/gpt_oss_20b/nb_20b_compiled_metrics.json", "tokens_per_s.0", compiled=True, **today)
    add("h100x1_2026-12-06/gpt_oss_20b/nb_20b_eager_metrics.json", "tokens_per_s.0", compiled=False, **today)
    # 2026-12-07: the ways to fit the activations, side by side (issue 58)
    fitted = "h100x1_2026-12-07/gpt_oss_20b/"
    add(fitted + "nb_20b_compiled_checkpointing_metrics.json", "tokens_per_s.0", compiled=True, **today)
    add(fitted + "nb_20b_compiled_no_checkpointing_metrics.json", "tokens_per_s.0", compiled=True,
        **{**today, "checkpointing": False})
    add(fitted + "nb_20b_compiled_micro_batch_2_metrics.json", "tokens_per_s.0", compiled=True,
        **{**today, "checkpointing": False, "micro_batch": 2})
    add(fitted + "20b_every2_compiled_packed.json", compiled=True,
        **{**today, "variant": "gradient checkpointing of every 2nd decoder layer only"})

    # GPT-OSS-120B, the TRL notebook's LoRA under FSDP2 (4 of 36 layers: what one GPU holds), checkpointing
    gpt120 = dict(model="gpt-oss-120b", layers=4, framework="trl", fine_tune="lora", technique="fsdp",
                  checkpointing=True)
    peft = "the experts' LoRA by PEFT, W + BA for all 128 experts (before 2026-12-06)"
    add("trl/fsdp_120b_2gpu/metrics.json", gpus=2, micro_batch=4, seq_len=512, data=SHORT, compiled=False,
        variant=peft + ", the notebook of 2026-11-30", **gpt120)
    add("h200x1_2026-12-02/call3_rest/gpt_oss_120b.json", "tokens_per_s.0", micro_batch=2, seq_len=2048, data=SHORT,
        compiled=False, variant=peft, not_counted=SHARED, **{**gpt120, "layers": 1})
    rows = dict(gpt120, micro_batch=2, seq_len=2048, data=FULL_ROWS)
    add("h100x1_2026-12-05/gpt_oss_120b_fsdp/120b_eager_packed.json", compiled=False, variant=peft, **rows)
    add(["h100x1_2026-12-06/gpt_oss_120b_fsdp/120b_eager_packed.json",
         "h100x1_2026-12-06/gpt_oss_120b_expert_lora/call1/120b_peft_eager_packed.json"], compiled=False, variant=peft,
        **rows)
    add("h100x1_2026-12-06/gpt_oss_120b_notebooks/nb_120b_eager_metrics.json", "tokens_per_s.0", compiled=False,
        variant=peft, **rows)
    around = peft + "; layers compiled around the experts"
    add("h100x1_2026-12-06/gpt_oss_120b_fsdp/120b_compiled_packed.json", compiled=True, variant=around, **rows)
    add("h100x1_2026-12-06/gpt_oss_120b_notebooks/nb_120b_compiled_metrics.json", "tokens_per_s.0", compiled=True,
        variant=around, **rows)
    attention_only = "LoRA on the attention only (EXPERTS = [])"
    add("h100x1_2026-12-06/gpt_oss_120b_fsdp/120b_attention_lora_compiled_packed.json", compiled=True,
        variant=attention_only, **rows)
    add("h100x1_2026-12-06/gpt_oss_120b_fsdp/120b_attention_lora_eager_packed.json", compiled=False,
        variant=attention_only, **rows)
    add(["h100x1_2026-12-06/gpt_oss_120b_expert_lora/call1/120b_eager_packed.json",
         "h100x1_2026-12-06/gpt_oss_120b_expert_lora/call2/120b_eager_packed.json"], compiled=False, **rows)
    add(["h100x1_2026-12-06/gpt_oss_120b_expert_lora/call1/nb_120b_eager_metrics.json",
         "h100x1_2026-12-06/gpt_oss_120b_expert_lora/call4/nb_120b_eager_metrics.json"], "tokens_per_s.0",
        compiled=False, **rows)
    add("h100x1_2026-12-06/gpt_oss_120b_expert_lora/call2/120b_compiled_packed.json", compiled=True, **rows)
    add("h100x1_2026-12-06/gpt_oss_120b_expert_lora/call2/nb_120b_compiled_metrics.json", "tokens_per_s.0",
        compiled=True, **rows)

    # Qwen3.8-27B, recipes/fsdp2_qwen3_multinode: full fine-tune, FSDP2, checkpointing, one row a step
    qwen = dict(model="qwen3.8-27b", framework="pytorch", fine_tune="full", technique="fsdp", checkpointing=True,
                micro_batch=1)
    fallback = "Gated DeltaNet by PyTorch's fallback, sdpa attention"
    sdpa = "sdpa attention instead of flex_attention"
    add("h200x1_2026-12-01/qwen35/synthetic_12_layers/metrics.json", layers=12, seq_len=4096, data=SYNTHETIC,
        compiled=False, variant=fallback, **qwen)
    add("h200x1_2026-12-01/qwen35/packed_12_layers/metrics.json", layers=12, seq_len=4096, data=FULL_ROWS,
        compiled=False, variant=fallback + "; the packed conv's backward by index_put", **qwen)
    add("h200x1_2026-12-03/call2_qwen35/synthetic_12_layers_torch_kernels.json", layers=12, seq_len=4096,
        data=SYNTHETIC, compiled=False, variant=fallback, **qwen)
    add("h200x1_2026-12-03/call2_qwen35/synthetic_12_layers_fla_cached.json", layers=12, seq_len=4096, data=SYNTHETIC,
        compiled=False, variant=sdpa, **qwen)
    add("h200x1_2026-12-03/call2_qwen35/packed_12_layers_fla.json", layers=12, seq_len=4096, data=FULL_ROWS,
        compiled=False, variant=sdpa + "; the packed conv's backward by index_put", **qwen)
    for length in (4096, 8192):
        call = "qwen35_call1" if length == 4096 else "qwen35_call2"
        add(f"h200x1_2026-12-05/{call}/packed_{length}/metrics.json", layers=12, seq_len=length, data=FULL_ROWS,
            compiled=True, **qwen)
        add(f"h200x1_2026-12-05/{call}/synthetic_{length}/metrics.json", layers=12, seq_len=length, data=SYNTHETIC,
            compiled=True, **qwen)
    add("h200x1_2026-12-05/qwen35_call2/profiled_packed_4096/metrics.json", layers=12, seq_len=4096, data=FULL_ROWS,
        compiled=True, not_counted=PROFILED, **qwen)
    add("h100x1_2026-12-05/qwen35_call1/packed_4096_pytorch_reference/metrics.json", layers=4, seq_len=4096,
        data=FULL_ROWS, compiled=False, variant=fallback, **qwen)
    add("h100x1_2026-12-05/qwen35_call1/packed_4096_sdpa_compiled/metrics.json", layers=4, seq_len=4096,
        data=FULL_ROWS, compiled=True, variant=sdpa, **qwen)
    add("h100x1_2026-12-05/qwen35_call2/packed_4096/metrics.json", layers=4, seq_len=4096, data=FULL_ROWS,
        compiled=True, **qwen)

    # Llama-3.2-1B: the fast-steps guide (FSDP2 on one rank, bf16, eager, 4 x 2,048 random tokens), a row per knob
    guide = dict(model="llama-3.2-1b", layers=16, framework="pytorch", fine_tune="full", technique="fsdp",
                 compiled=False, checkpointing=False, data=SYNTHETIC, micro_batch=4, seq_len=2048)
    knobs = {"baseline": {}, "fp32": dict(variant="fp32 instead of bf16"), "checkpointing": dict(checkpointing=True),
             "2x batch": dict(micro_batch=8), "reshard": dict(variant="reshard_after_forward=False"),
             "DDP": dict(technique="ddp"), "0 workers": dict(variant="DataLoader: 0 workers, pageable memory"),
             "compile": dict(compiled=True)}
    for file, rows_of in GUIDES:
        for index, knob in enumerate(rows_of):
            if knob:
                add(file, f"knobs.{index}.tokens_per_s", **{**guide, **knobs[knob]})
    # the guides' own baseline before the knob table (the H100 guide's is the table's first row: not a second run)
    add([file for file, _ in GUIDES[:2]], "tokens_per_s", **guide)
    recipe = dict(framework="pytorch", fine_tune="full", technique="fsdp", compiled=True, data=SYNTHETIC, micro_batch=4,
                  seq_len=2048, gpus=2)
    add("recipes/mfu_llama_3_2_1b/metrics.json", model="llama-3.2-1b", layers=16, checkpointing=False, **recipe)
    add("recipes/mfu_qwen3_8b/metrics.json", model="qwen3-8b", layers=36, checkpointing=True, **recipe)
    # the TRL notebook's full fine-tune of Llama-3.2-1B (DeepSpeed ZeRO-3, or DDP), checkpointing
    llama = dict(model="llama-3.2-1b", layers=16, framework="trl", fine_tune="full", compiled=False, checkpointing=True,
                 data=SHORT)
    add("trl/llama_zero3_2gpu/metrics.json", technique="zero3", gpus=2, micro_batch=16, seq_len=512,
        variant="the notebook of 2026-11-30", **llama)
    add("trl/llama_ddp_2gpu/metrics.json", technique="ddp", gpus=2, micro_batch=16, seq_len=512,
        variant="the notebook of 2026-11-30", **llama)
    add("h200x1_2026-12-01/trl/llama_1gpu/metrics.json", "tokens_per_s.0", technique="zero3", micro_batch=4,
        seq_len=1024, variant="the notebook of 2026-12-01", not_counted=SHARED, **llama)
    add("h200x1_2026-12-03/call1_owed_notebooks/llama_zero3.json", "tokens_per_s.0", technique="zero3", micro_batch=4,
        seq_len=1024, **llama)

    # Llama-3.2-3B LoRA r=16: benchmarks/unsloth_vs_trl.py (2 x 4 x 2,048 tokens, 16,156 of them real) and the notebook
    lora3b = dict(model="llama-3.2-3b", layers=28, fine_tune="lora", technique="ddp", compiled=False,
                  checkpointing=True, micro_batch=2, seq_len=2048)
    full = dict(lora3b, data=FULL_ROWS)
    together = "the two 1-GPU runs ran at the same time, one per GPU, sharing the host (benchmarks/README)"
    for engine in ("trl", "unsloth"):
        add(f"unsloth/{engine}_1gpu.json", framework=engine, not_counted=together, **full)
        add(f"unsloth/{engine}_2gpu.json", framework=engine, gpus=2, **full)
        for call in ("call1_unsloth_cold", "call2_unsloth"):
            add(f"h200x1_2026-12-04/{call}/{engine}_1gpu.json", framework=engine, **full)
    for call in ("call1_unsloth_cold", "call2_unsloth"):
        add(f"h200x1_2026-12-04/{call}/unsloth_repeat_1gpu.json", framework="unsloth", **full)
        add(f"h200x1_2026-12-04/{call}/unsloth_late_1gpu.json", framework="unsloth",
            variant="Unsloth imported after Transformers", **full)
    add("h200x1_2026-12-01/unsloth/notebook_1gpu.json", framework="unsloth", data=SHORT, not_counted=SHARED,
        variant="Unsloth imported after Transformers", **lora3b)
    add("h200x1_2026-12-03/call1_owed_notebooks/unsloth.json", "tokens_per_s.0", framework="unsloth", data=SHORT,
        variant="Unsloth imported after Transformers", **lora3b)
    add("h200x1_2026-12-04/call2_unsloth/notebook_1gpu.json", "tokens_per_s.0", framework="unsloth", data=SHORT,
        **lora3b)

    # Qwen2.5-3B, recipes/ray_qwen2_5_3b: its PyTorch loop under Ray Train, full fine-tune, DDP, 4 packed rows of 1,024
    ray = dict(model="qwen2.5-3b", layers=36, framework="pytorch", fine_tune="full", technique="ddp",
               compiled=False, data=FULL_ROWS, micro_batch=4, seq_len=1024)
    before = "the recipe of 2026-11-30 (foreach AdamW, gradients beside DDP's buckets)"
    add("ray/summary.json", "qwen2_5_3b.tokens_per_s_1w", checkpointing=False, variant=before, **ray)
    add("ray/summary.json", "qwen2_5_3b.tokens_per_s_2w", checkpointing=False, gpus=2, variant=before, **ray)
    add(["h100x1_2026-12-06/ray_recipes/qwen2_5_3b_1w_metrics.json",
         "h100x1_2026-12-06/ray_recipes/qwen2_5_3b_1w_nockpt_metrics.json"], checkpointing=False, **ray)
    add("h100x1_2026-12-06/ray_recipes/qwen2_5_3b_1w_ckpt_metrics.json", checkpointing=True, **ray)

    # Olmo-3-7B, the Axolotl notebook: LoRA r=32, 2 packed rows of 2,048 tokens a micro-step, checkpointing
    add(["h200x1_2026-12-01/axolotl/lora_1gpu.json", "h200x1_2026-12-03/call3_axolotl/axolotl.json"],
        model="olmo-3-7b", layers=32, framework="axolotl", fine_tune="lora", technique="ddp", compiled=False,
        checkpointing=True, data=FULL_ROWS, micro_batch=2, seq_len=2048)

    # the recipes' launch checks on tiny stand-ins, 1 node x 2 GPUs and 2 nodes x 1 GPU
    for name in ("fsdp_1x2", "fsdp_2x1", "fsdp2_1x2", "fsdp2_2x1", "deepspeed_1x2", "deepspeed_2x1"):
        add(f"recipes/{name}/metrics.json", model="tiny", layers=2, framework="pytorch", fine_tune="full",
            technique="fsdp", compiled=False, checkpointing=False, data=FULL_ROWS, micro_batch=1, seq_len=512, gpus=2,
            not_counted=TINY)
    return runs


RUNS = _runs()
# Runs of the same settings, 1 GPU then 2, one after the other on one machine: per-GPU speed on 2 GPUs against 1
TWO_GPU_PAIRS = [("trl/ddp_20b_1gpu", "trl/ddp_20b_2gpu"),
                 ("trl/gpt_oss_20b_accum4/ddp_20b_1gpu", "trl/gpt_oss_20b_accum4/ddp_20b_2gpu"),
                 ("ray/summary[qwen2_5_3b.tokens_per_s_1w]", "ray/summary[qwen2_5_3b.tokens_per_s_2w]")]
DATABRICKS = dict(steps=983, sequences=32, seq_len=8192, gpus=32, gpu="H100", minutes=70)


def read_tokens_per_s(run: Run) -> float:
    value = json.loads((RESULTS / run.file).read_text())
    for part in run.key.split("."):
        value = value[int(part)] if isinstance(value, list) else value[part]
    return float(value)


def recorded_device(run: Run) -> str | None:
    """The GPU the file names, where it names one, to check the folder's."""
    text = json.dumps(json.loads((RESULTS / run.file).read_text()))
    found = {gpu for gpu in ("H100", "H200") if f"NVIDIA {gpu}" in text}
    return found.pop() if len(found) == 1 else None


@cache
def _flops(model: str, layers: int, seq_len: int) -> float:
    import torch
    import transformers

    with torch.device("meta"):
        built = transformers.AutoModelForCausalLM.from_config(model_configs.config(model, layers=layers),
                                                              dtype=torch.bfloat16)
    return flops_per_token(built, seq_len)


def measured(run: Run) -> Measured:
    device = recorded_device(run)
    if device and device != run.gpu:
        raise ValueError(f"{run.file}: the file names {device}, its folder {run.gpu}")
    per_gpu = read_tokens_per_s(run) / run.gpus
    flops = _flops(run.model, run.layers, run.seq_len)
    return Measured(run.model, run.layers, run.framework, run.variant, run.fine_tune, run.technique, run.compiled,
                    run.checkpointing, run.data, run.micro_batch, run.seq_len, run.gpu, run.gpus, round(per_gpu, 1),
                    flops, round(per_gpu * flops / PEAK_BF16_FLOPS[run.gpu], 4), run.name, run.date)


def two_gpu_efficiency(pairs=TWO_GPU_PAIRS) -> float:
    by_name = {run.name: run for run in RUNS}
    ratios = [read_tokens_per_s(by_name[two]) / (2 * read_tokens_per_s(by_name[one])) for one, two in pairs]
    return round(statistics.median(ratios), 3)


def make_table() -> dict:
    rows = [measured(run) for run in RUNS if not run.not_counted]
    default = math.floor(100 * statistics.quantiles([r.mfu for r in rows], n=4)[0]) / 100
    return {"made_by": "benchmarks/mfu_table.py from benchmarks/results: do not edit, run it",
            "mfu": "tokens/s per GPU x flops_per_token (nbhelpers.planner.flops) / the GPU's dense bf16 peak",
            "two_gpu_efficiency": two_gpu_efficiency(),
            "two_gpu_pairs": [list(pair) for pair in TWO_GPU_PAIRS],
            "default_mfu": default,
            "default_mfu_is": "the lower quartile of the runs' MFU, rounded down to a whole percent",
            "runs": [asdict(row) for row in rows]}


def table_text(table: dict) -> str:
    """The table as the package ships it: JSON, a run a line."""
    head = {key: value for key, value in table.items() if key != "runs"}
    runs = ",\n".join("  " + json.dumps(row) for row in table["runs"])
    return json.dumps(head, indent=1)[:-2] + ',\n "runs": [\n' + runs + "\n ]\n}\n"


def workload_of(row: Measured) -> Workload:
    return Workload(row.model, row.layers, row.fine_tune, row.technique, row.gpu, row.gpus, row.seq_len,
                    row.micro_batch, row.checkpointing, row.compiled, row.framework, row.variant, row.data)


def leave_one_out(table: dict, strict: bool = False) -> list[dict]:
    """Each run's time estimated without it (strict: without every run of the same settings, so from another shape,
    card or code only); error = estimated time / measured time - 1 = measured tokens/s / estimated tokens/s - 1."""
    out = []
    rows = table["runs"]
    for row in rows:
        want = workload_of(row)
        same = lambda other: workload_of(other) == want if strict else other is row  # noqa: E731
        others = [other for other in rows if not same(other)]
        efficiency = two_gpu_efficiency([pair for pair in TWO_GPU_PAIRS if row.run not in pair])
        found = nearest(want, others)
        mfu = scaled_mfu(want, found, efficiency, table["default_mfu"])
        out.append({"run": row.run, "model": row.model, "gpu": f"{row.gpus} x {row.gpu}", "measured_mfu": row.mfu,
                    "estimated_mfu": mfu, "error": row.mfu / mfu - 1,
                    "from": (found[0].run if len(found) == 1 else f"median of {len(found)}") if found else "default"})
    return out


def databricks(table: dict) -> dict:
    """Databricks' Qwen3.8-27B recipe (ai-runtime-cookbook, post-training/sft-qwen3.8-27b-fsdp2-multinode): 983 steps of
    32 x 8,192 tokens on 4 nodes of 8 H100, about 1 h 45 min including about 35 min of setup."""
    d = DATABRICKS
    want = Workload("qwen3.8-27b", 64, "full", "fsdp", d["gpu"], d["gpus"], d["seq_len"], 1, True, None, "pytorch")
    found = nearest(want, table["runs"])
    mfu = scaled_mfu(want, found, table["two_gpu_efficiency"], table["default_mfu"])
    flops = _flops("qwen3.8-27b", 64, d["seq_len"])
    minutes = d["steps"] * d["sequences"] * d["seq_len"] * flops / (d["gpus"] * PEAK_BF16_FLOPS[d["gpu"]] * mfu) / 60
    return {"estimated_minutes": minutes, "databricks_minutes": d["minutes"], "error": minutes / d["minutes"] - 1,
            "mfu": mfu, "from": [r.run for r in found]}


def markdown(table: dict) -> str:
    table = {**table, "runs": [Measured(**row) for row in table["runs"]]}
    loo, strict, check = leave_one_out(table), leave_one_out(table, strict=True), databricks(table)
    within = lambda rows: sum(abs(r["error"]) <= 0.20 for r in rows)  # noqa: E731
    worst = max(loo, key=lambda r: abs(r["error"]))
    guide = [r for r in loo if r["run"].split("[")[0] in GUIDE_RUNS]
    others = [r for r in loo if r not in guide]
    lines = [f"{len(loo)} runs counted of {len(RUNS)} listed ({len(RUNS) - len(loo)} left out, each for its reason "
             f"below); 2-GPU efficiency {table['two_gpu_efficiency']:.1%}, default MFU {table['default_mfu']:.0%}.",
             "",
             f"- **Leave-one-out: {within(loo)} of {len(loo)} runs within +-20 % ({within(loo) / len(loo):.0%}; goal "
             f">= 80 %)**; worst {worst['error']:+.0%} ({worst['run']}).",
             "- By model: " + "; ".join(
                 f"{model} {within([r for r in loo if r['model'] == model])} of "
                 f"{sum(r['model'] == model for r in loo)}" for model in dict.fromkeys(r["model"] for r in loo)) + ".",
             f"- Without the fast-steps guide's rows ({len(guide)} of the {len(loo)}: four runs of one knob table, "
             f"alike): {within(others)} of {len(others)} ({within(others) / len(others):.0%}).",
             f"- Stricter, every run of the same settings left out too (the estimate from another shape, card or code "
             f"only): {within(strict)} of {len(strict)} ({within(strict) / len(strict):.0%}).",
             f"- **Databricks' Qwen3.8-27B on 32 H100: estimated {check['estimated_minutes']:.0f} min against about "
             f"{check['databricks_minutes']} ({check['error']:+.0%}; goal +-25 %)**, at {check['mfu']:.1%} MFU from "
             f"{', '.join(check['from'])}.",
             "", "| run | model | GPUs | MFU measured | estimated (left out) | error | estimated from | strict error |",
             "|---|---|---|---|---|---|---|---|"]
    for r, s in zip(loo, strict):
        source = r["from"] if r["from"].startswith(("median", "default")) else f"`{r['from']}`"
        lines.append(f"| `{r['run']}` | {r['model']} | {r['gpu']} | {r['measured_mfu']:.1%} | {r['estimated_mfu']:.1%} "
                     f"| {r['error']:+.0%} | {source} | {s['error']:+.0%} |")
    lines += ["", "Left out of the table:", ""]
    lines += [f"- `{run.name}`: {run.not_counted}" for run in RUNS if run.not_counted]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--markdown", action="store_true", help="print the checks as benchmarks/README.md shows them")
    args = parser.parse_args()
    table = make_table()
    if args.markdown:
        print(markdown(table))
        return
    TABLE.write_text(table_text(table))
    print(f"wrote {TABLE.relative_to(ROOT)}: {len(table['runs'])} runs")
    print(markdown(table).split("\n\n| run")[0])


if __name__ == "__main__":
    main()
