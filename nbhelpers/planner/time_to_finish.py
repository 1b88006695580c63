"""How long, on how many GPUs? The time a fine-tune will take, before it starts, from the speeds this cookbook measured.

    seconds = tokens x FLOPs per token / (GPUs x the GPU's peak x MFU)

- tokens: max_steps x per_device_train_batch_size x gradient_accumulation_steps x GPUs x seq_len (every sequence
  full, as packed rows are), or, with max_steps -1, the data set's tokens x num_train_epochs;
- FLOPs per token: `nbhelpers.planner.flops.flops_per_token`, the MFU formula of the recipes and the guides;
- MFU: the nearest run of `mfu_table.json`, which `benchmarks/mfu_table.py` makes from `benchmarks/results` (every
  GPU run of the cookbook with a tokens/s figure it can use). Nearest: the same model (and framework, where it is
  given), then, in this order, the same data, fine-tune, torch.compile, gradient checkpointing, technique and code
  (`variant`: today's, or what differed); then the closest depth and sequence length; then one GPU or several, the
  GPU, the closest micro-batch. Equally near runs: their median. No run of the model: the table's `default_mfu`, the
  lower quartile of all runs' MFU (a conservative figure);
- several GPUs: per GPU, the median speed of 2 GPUs against 1 in the measured pairs (`two_gpu_efficiency`); for more
  than 2 GPUs that is an assumption, said as such (nothing beyond 2 GPUs was measured).

    estimate = time_to_finish(load_model("qwen3.8-27b"), "fsdp", gpus=32, gpu="H100", seq_len=8192,
                              tokens=983 * 32 * 8192, checkpointing=True)
    str(estimate)  # 'about 1 h 14 min (39.6 GPU-hours) on 32 x H100 at 30 % MFU (measured on 1 x H200: ...; ...)'
"""
from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, fields
from pathlib import Path

from nbhelpers.planner.flops import PEAK_BF16_FLOPS, flops_per_token
from nbhelpers.planner.model_configs import MODELS

TABLE = Path(__file__).with_name("mfu_table.json")
FULL_ROWS = "full rows"  # data: every sequence max_length tokens long (packed), what `tokens` assumes
FRAMEWORKS = ("trl", "unsloth", "axolotl", "pytorch")  # pytorch: a training loop of its own (the recipes, the guides)
SHORT_ROWS = "short rows, padded"  # data: the notebooks' small test sets, conversations far shorter than max_length


@dataclass(frozen=True)
class Measured:
    """One GPU run of benchmarks/results: what ran, and its speed."""
    model: str  # a name of nbhelpers.planner.model_configs.MODELS
    layers: int  # decoder layers of the stand-in that ran (fewer than published where the GPU held no more)
    framework: str  # one of FRAMEWORKS
    variant: str  # "" for the code the cookbook runs today; else what differed (an older notebook, a knob)
    fine_tune: str  # "full", "lora"
    technique: str  # nbhelpers.planner.plan.TECHNIQUES
    compiled: bool  # torch.compile
    checkpointing: bool  # gradient checkpointing
    data: str  # "full rows" (packed, or as long as max_length), "synthetic" (random tokens), "short rows, padded"
    micro_batch: int  # per_device_train_batch_size
    seq_len: int  # max_length
    gpu: str  # a key of nbhelpers.planner.flops.PEAK_BF16_FLOPS
    gpus: int
    tokens_per_s_per_gpu: float
    flops_per_token: float
    mfu: float
    run: str  # the file under benchmarks/results, and the figure's key in it where the file holds several
    date: str


@dataclass(frozen=True)
class Workload:
    """What is about to run; None: not known (matches any run)."""
    model: str | None
    layers: int
    fine_tune: str
    technique: str
    gpu: str
    gpus: int
    seq_len: int
    micro_batch: int = 1
    checkpointing: bool | None = None
    compiled: bool | None = None
    framework: str | None = None
    variant: str = ""
    data: str = FULL_ROWS


@dataclass
class TimeToFinish:
    seconds_per_step: float | None  # None where the step's tokens are not known
    seconds: float | None  # None where the tokens to train are not known (max_steps -1 and no data set size)
    gpus: int
    gpu: str
    mfu: float  # per GPU, with the scaling to `gpus` applied
    measured: list[Measured]  # the nearest runs (empty: the default MFU)
    two_gpu_efficiency: float
    price_per_gpu_hour: float | None = None
    workload: str = "this model"  # what no run measured, where `measured` is empty

    @property
    def gpu_hours(self) -> float | None:
        return None if self.seconds is None else self.seconds * self.gpus / 3600

    @property
    def cost(self) -> float | None:
        if self.gpu_hours is None or self.price_per_gpu_hour is None:
            return None
        return self.gpu_hours * self.price_per_gpu_hour

    def to_dict(self) -> dict:
        return {"seconds": self.seconds, "seconds_per_step": self.seconds_per_step, "gpu_hours": self.gpu_hours,
                "cost": self.cost, "gpus": self.gpus, "gpu": self.gpu, "mfu": self.mfu,
                "measured": [row.run for row in self.measured], "said": str(self)}

    def source(self) -> str:
        """Where the MFU comes from, and what is assumed beyond the measurements."""
        if not self.measured:
            return f"no measured run of {self.workload}: an assumed MFU, the lower quartile of the cookbook's runs"
        first = self.measured[0]
        runs = first.run if len(self.measured) == 1 else f"median of {len(self.measured)} runs, e.g. {first.run}"
        where = (f"measured on {first.gpus} x {first.gpu}" if (first.gpus, first.gpu) != (self.gpus, self.gpu)
                 else "measured")
        said = f"{where}: {runs}"
        if (self.gpus > 1 and first.gpus == 1) or self.gpus > 2:
            said += (f"; {self.gpus} GPUs at {100 * self.two_gpu_efficiency:.0f} % of one GPU's speed each, as "
                     "measured on 2" + (", assumed beyond 2" if self.gpus > 2 else ""))
        return said

    def __str__(self) -> str:
        if self.seconds is None:
            took = f"about {duration(self.seconds_per_step)} a step" if self.seconds_per_step else "time unknown"
        else:
            notes = [f"{self.gpu_hours:,.1f} GPU-hours"] if self.gpus > 1 else []
            if self.cost is not None:
                notes.append(f"cost {self.cost:,.2f} at {self.price_per_gpu_hour:g} per GPU-hour")
            took = f"about {duration(self.seconds)}" + (f" ({', '.join(notes)})" if notes else "")
        return f"{took} on {self.gpus} x {self.gpu} at {100 * self.mfu:.0f} % MFU ({self.source()})"


def duration(seconds: float) -> str:
    """12 s, 14 min, 1 h 10 min, 3.2 days."""
    if seconds < 60:
        return f"{seconds:.2g} s" if seconds < 10 else f"{seconds:.0f} s"
    minutes = round(seconds / 60)
    if minutes < 60:
        return f"{minutes} min"
    if minutes < 48 * 60:
        return f"{minutes // 60} h {minutes % 60} min"
    return f"{seconds / 86400:.1f} days"


def tokens_to_train(*, max_steps: int | None, per_device_train_batch_size: int, gradient_accumulation_steps: int = 1,
                    gpus: int, seq_len: int, dataset_tokens: int | None = None,
                    num_train_epochs: float = 1) -> int | None:
    """Tokens the run trains on: max_steps (> 0) of the global batch of full sequences, else the data set's tokens x
    num_train_epochs, else None (not known before the data is read)."""
    if max_steps is not None and max_steps > 0:
        return max_steps * per_device_train_batch_size * gradient_accumulation_steps * gpus * seq_len
    return round(dataset_tokens * num_train_epochs) if dataset_tokens else None


def gpu_type(name: str) -> str | None:
    """"NVIDIA H100 80GB HBM3" -> "H100": the key of PEAK_BF16_FLOPS in a GPU's name, None for an unknown GPU."""
    return next((key for key in PEAK_BF16_FLOPS if key.lower() in name.lower()), None)


def model_family(name: str) -> str | None:
    """The published model a hub id, folder or stand-in name is (the longest MODELS name in it), None if none."""
    found = [known for known in MODELS if known in str(name).lower()]
    return max(found, key=len) if found else None


def load_table(path: Path = TABLE) -> dict:
    table = json.loads(Path(path).read_text())
    names = {f.name for f in fields(Measured)}
    table["runs"] = [Measured(**{k: v for k, v in row.items() if k in names}) for row in table["runs"]]
    return table


def _distance(want: Workload, row: Measured) -> tuple:
    same = [(want.framework, row.framework), (want.data, row.data), (want.fine_tune, row.fine_tune),
            (want.compiled, row.compiled), (want.checkpointing, row.checkpointing), (want.technique, row.technique),
            (want.variant, row.variant)]
    later = [(want.gpus > 1, row.gpus > 1), (want.gpu, row.gpu)]
    return (tuple(int(a is not None and a != b) for a, b in same)
            + (abs(math.log(want.layers / row.layers)), abs(math.log(want.seq_len / row.seq_len)))
            + tuple(int(a != b) for a, b in later) + (abs(math.log(want.micro_batch / row.micro_batch)),))


def nearest(want: Workload, runs: list[Measured]) -> list[Measured]:
    """The runs nearest to `want` (module docstring), all equally near; [] where none ran its model (with its
    framework, where it names one). Runs on short padded rows serve only that data: their tokens/s counts real tokens
    of rows far shorter than max_length, where the estimate counts full rows."""
    mine = [row for row in runs if row.model == want.model and want.framework in (None, row.framework)
            and (row.data != SHORT_ROWS or want.data == SHORT_ROWS)]
    if not mine:
        return []
    best = min(_distance(want, row) for row in mine)
    return [row for row in mine if _distance(want, row) == best]


def scaled_mfu(want: Workload, measured: list[Measured], two_gpu_efficiency: float, default_mfu: float) -> float:
    """MFU per GPU on want.gpus: the runs' median, each moved from its GPU count to want's (1 GPU: 1, more: the 2-GPU
    efficiency)."""
    if not measured:
        return default_mfu
    efficiency = lambda gpus: 1.0 if gpus == 1 else two_gpu_efficiency  # noqa: E731
    return statistics.median(row.mfu * efficiency(want.gpus) / efficiency(row.gpus) for row in measured)


def time_to_finish(built, technique: str, *, gpus: int, gpu: str, seq_len: int, tokens: int | None,
                   micro_batch: int = 1, gradient_accumulation_steps: int = 1, lora_rank: int | None = None,
                   checkpointing: bool | None = None, torch_compile: bool | None = None, framework: str | None = None,
                   price_per_gpu_hour: float | None = None, table: dict | None = None) -> TimeToFinish:
    """The estimate for `built` ((name, model on the meta device), as nbhelpers.planner.plan.load_model returns it)
    trained with `technique` on `gpus` x `gpu` (a key of PEAK_BF16_FLOPS: "H100", "H200", ...) for `tokens`
    (tokens_to_train; None: only the time of a step, micro_batch x gradient_accumulation_steps x gpus sequences)."""
    if gpu not in PEAK_BF16_FLOPS:
        raise ValueError(f"gpu must be one of {', '.join(PEAK_BF16_FLOPS)} (its bf16 peak is known), not {gpu!r}")
    table = table or load_table()
    name, model = built
    want = Workload(model_family(name), model.config.num_hidden_layers, "lora" if lora_rank else "full", technique,
                    gpu, gpus, seq_len, micro_batch, checkpointing, torch_compile, framework)
    measured = nearest(want, table["runs"])
    mfu = scaled_mfu(want, measured, table["two_gpu_efficiency"], table["default_mfu"])
    tokens_per_s = gpus * PEAK_BF16_FLOPS[gpu] * mfu / flops_per_token(model, seq_len)
    step_tokens = micro_batch * gradient_accumulation_steps * gpus * seq_len
    return TimeToFinish(step_tokens / tokens_per_s, tokens / tokens_per_s if tokens else None, gpus, gpu, mfu,
                        measured, table["two_gpu_efficiency"], price_per_gpu_hour,
                        (want.model or name) + (f" with {framework}" if framework else ""))


def time_clause(built, technique: str, gpu_name: str, gpus: int, *, seq_len: int, micro_batch: int = 1,
                gradient_accumulation_steps: int = 1, max_steps: int | None = None, dataset_tokens: int | None = None,
                num_train_epochs: float = 1, **workload) -> str:
    """The planner's verdict's time clause for `gpus` x the GPU named `gpu_name` (as CUDA names it); `workload`:
    time_to_finish's lora_rank, checkpointing, torch_compile, framework, price_per_gpu_hour."""
    gpu = gpu_type(gpu_name)
    if gpu is None:
        return f"no time estimate: no peak FLOP/s known for {gpu_name}"
    tokens = tokens_to_train(max_steps=max_steps, per_device_train_batch_size=micro_batch,
                             gradient_accumulation_steps=gradient_accumulation_steps, gpus=gpus, seq_len=seq_len,
                             dataset_tokens=dataset_tokens, num_train_epochs=num_train_epochs)
    return str(time_to_finish(built, technique, gpus=gpus, gpu=gpu, seq_len=seq_len, tokens=tokens,
                              micro_batch=micro_batch, gradient_accumulation_steps=gradient_accumulation_steps,
                              **workload))
