"""The planner's verdict: each technique's estimate (`Estimate`), the technique it recommends and why, and the plan
as a table (`Plan`, what `plan()` returns).

The recommendation is the first technique that fits, in the order of what it costs: DDP (the whole training state on
every GPU: the fastest and simplest), then ZeRO-2, ZeRO-1 (the optimizer states, and gradients, sharded at DDP's
communication cost), then FSDP2 and ZeRO-3 (the parameters sharded too); sharding needs two GPUs or more. Only when
nothing fits on the GPUs is CPU offload recommended (`recommend`, `advice`).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

from nbhelpers.planner.techniques import LABELS, OFFLOAD_TECHNIQUES


@dataclass
class Estimate:
    technique: str
    parameters: float  # GiB per GPU, each term
    gradients: float
    optimizer: float
    activations: float
    temporaries: float  # optimizer step only: never alive together with the activations
    allowance: float
    total: float
    fits: bool  # on the GPU, and (offload) in the host memory when cpu_memory_gib is given
    gradients_held: float  # the part of `gradients` already allocated when backward starts
    peak_at: str  # "backward" (activations) or "optimizer step" (gradients + temporaries)
    cpu: float = 0.0  # GiB of host memory per GPU (offload techniques)

    @property
    def allocated(self) -> float:
        """What torch.cuda.max_memory_allocated should show: the total without the allowance."""
        return self.total - self.allowance

    def at_peak(self) -> dict:
        """The terms alive at the peak, in GiB; they add up to `total`."""
        backward = self.peak_at == "backward"
        return {"parameters": self.parameters, "optimizer": self.optimizer,
                "gradients": self.gradients_held if backward else self.gradients,
                "activations": self.activations if backward else 0.0,
                "step temporaries": 0.0 if backward else self.temporaries, "allowance": self.allowance}


@dataclass
class Plan:
    model: str
    parameters: int
    trainable: int
    gpus: int
    gpu_memory_gib: float
    precision: str
    fine_tune: str  # "full", "LoRA r=..." or "QLoRA r=... (nf4)"
    seq_len: int
    micro_batch: int
    checkpointing: bool
    attention: str
    estimates: list[Estimate]  # TECHNIQUES: everything on the GPUs
    recommended: str | None  # a key of TECHNIQUES, or None when none fits
    advice: str
    suggestions: list[str] = field(default_factory=list)
    offload: str | None = None  # when nothing fits on the GPUs: the OFFLOAD_TECHNIQUES key that fits, if any
    gpus_per_node: int = 1
    cpu_memory_gib: float | None = None  # per node; None: host memory not checked
    linear_attention: str | None = None  # Gated DeltaNet implementation counted (hybrid models)
    offload_estimates: list[Estimate] = field(default_factory=list)  # OFFLOAD_TECHNIQUES
    fused_adamw: bool = False
    gradient_as_bucket_view: bool = False
    chunked_loss: bool = False
    every_n_layers: int = 1  # with checkpointing: every k-th decoder layer is checkpointed

    def estimate(self, technique: str) -> Estimate:
        return next(e for e in self.estimates + self.offload_estimates if e.technique == technique)

    def fits(self, technique: str) -> bool:
        return self.estimate(technique).fits

    def rows(self) -> list[dict]:
        """One dict per technique (for pandas), with the plan's inputs."""
        head = {"model": self.model, "gpus": self.gpus, "gpu_memory_gib": self.gpu_memory_gib,
                "fine_tune": self.fine_tune, "precision": self.precision, "seq_len": self.seq_len,
                "micro_batch": self.micro_batch, "checkpointing": self.checkpointing,
                "every_n_layers": self.every_n_layers}
        return [{**head, **asdict(e), "recommended": e.technique in (self.recommended, self.offload)}
                for e in self.estimates + self.offload_estimates]

    def to_dict(self) -> dict:
        """Everything, JSON-ready: the inputs, each technique's terms in GiB per GPU, the answer."""
        return {**{k: v for k, v in asdict(self).items() if k not in ("estimates", "offload_estimates")},
                "estimates": {e.technique: {**asdict(e), "allocated": e.allocated}
                              for e in self.estimates + self.offload_estimates}}

    def table(self) -> str:
        lines = [f"{self.model}: {self.parameters / 1e9:.2f} B parameters, {self.fine_tune} fine-tune "
                 f"({self.trainable / 1e9:.3g} B trainable), {self.precision}",
                 f"{self.gpus} GPU{'s' if self.gpus > 1 else ''} x {self.gpu_memory_gib:g} GiB, {self.micro_batch} x "
                 f"{self.seq_len} tokens per GPU, {checkpointing_words(self.checkpointing, self.every_n_layers)}, "
                 f"{self.attention} attention" + (f", Gated DeltaNet: {self.linear_attention}"
                                                  if self.linear_attention else ""),
                 f"{'GiB per GPU':20s} {'params':>7s} {'grads':>7s} {'optim':>7s} {'activ':>7s} {'step tmp':>8s} "
                 f"{'allow':>7s} {'total':>7s} {'CPU':>7s}  fits  peak at"]
        for e in self.estimates + self.offload_estimates:
            label = "1 GPU, no DDP" if e.technique == "ddp" and self.gpus == 1 else LABELS[e.technique]
            lines.append(f"{label:20s} {e.parameters:7.1f} {e.gradients:7.1f} {e.optimizer:7.1f} "
                         f"{e.activations:7.1f} {e.temporaries:8.1f} {e.allowance:7.1f} {e.total:7.1f} "
                         f"{e.cpu:7.1f}  {'yes ' if e.fits else 'no  '}  {e.peak_at}"
                         f"{'  <- recommended' if e.technique in (self.recommended, self.offload) else ''}")
        lines.append(self.advice)
        lines += [f"  - {s}" for s in self.suggestions]
        return "\n".join(lines)

    __repr__ = __str__ = table


def checkpointing_words(checkpointing: bool, every_n_layers: int = 1, name: str = "activation checkpointing") -> str:
    if not checkpointing:
        return "no checkpointing"
    if every_n_layers == 1:
        return name
    n = every_n_layers
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{name} of every {n}{suffix} decoder layer"


def recommend(estimates: list[Estimate], gpus: int) -> tuple[str | None, str | None]:
    """(the technique recommended, or None when none fits on the GPUs alone; then the offload technique that fits,
    if any)."""
    fitting = {e.technique for e in estimates if e.fits}
    order = ["ddp"] if gpus == 1 else ["ddp", "zero2", "zero1", "fsdp", "zero3"]  # sharding needs >= 2 GPUs
    recommended = next((t for t in order if t in fitting), None)
    offload = None if recommended else next((t for t in OFFLOAD_TECHNIQUES if t in fitting), None)
    return recommended, offload


def advice(recommended, offload, estimates: list[Estimate], gpus, memory, gpus_per_node, cpu_memory) -> str:
    """The verdict in a sentence: what is recommended and why, or that only offload fits, or that nothing does."""
    fitting = {e.technique for e in estimates if e.fits}
    estimates = {e.technique: e for e in estimates}
    if recommended is None:
        if offload:
            e = estimates[offload]
            host = e.cpu * gpus_per_node
            checked = f"of {cpu_memory:g} GiB" if cpu_memory is not None else "(host memory not checked: pass it)"
            return (f"fits on the GPUs only with CPU offload: {LABELS[offload]}, {e.total:.1f} of {memory:g} GiB per "
                    f"GPU and {host:.0f} GiB {checked} of CPU memory per node ({gpus_per_node} GPUs), slower steps. "
                    f"Without offload nothing fits {gpus} x {memory:g} GiB; also:")
        return f"fits nowhere: no technique fits {gpus} x {memory:g} GiB; use LoRA, more GPUs or CPU offload:"
    spare = memory - estimates[recommended].total
    why = {"ddp": "the whole training state fits on every GPU, so plain data parallelism (fastest, simplest)"
                  if gpus > 1 else "it fits one GPU: plain single-GPU training, nothing to distribute",
           "zero2": "DDP does not fit; sharding the optimizer states and gradients (ZeRO-2) does, at DDP's "
                    "communication cost" + (" (ZeRO-1 fits too)" if "zero1" in fitting else ""),
           "zero1": "DDP does not fit; sharding the optimizer states (ZeRO-1) does",
           "fsdp": "only sharding the parameters too fits: FSDP2"
                   + (" (or DeepSpeed ZeRO-3, which fits as well)" if "zero3" in fitting else ""),
           "zero3": "only DeepSpeed ZeRO-3 fits (FSDP2's larger gathered units do not)"}[recommended]
    label = "single GPU (no DDP)" if gpus == 1 else LABELS[recommended]
    return f"recommended: {label}, {estimates[recommended].total:.1f} of {memory:g} GiB " \
           f"({spare:.1f} GiB spare): {why}."
