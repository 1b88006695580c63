"""Sequence packing that keeps Qwen3.5's Gated DeltaNet layers inside each sample, and their kernels.

What transformers 5.17 does with a packed row (models/qwen3_5/modeling_qwen3_5.py): the full-attention
layers read the restarting position_ids and get a block-diagonal mask, but the linear-attention layers
(Qwen3_5GatedDeltaNet) never look at position_ids. Their causal conv1d (width 4) reads the last 3 tokens of
the previous sample and their recurrent state flows on from one sample into the next: packed samples leak
into each other, in the PyTorch fallback and with the kernels alike. The layer passes the model call's
kwargs to `causal_conv1d_fn` and `cu_seq_lens_q` (as `cu_seqlens`) to `chunk_gated_delta_rule`; the
fallbacks ignore both, flash-linear-attention honours cu_seqlens (batch 1 only), causal-conv1d does not take
it (it takes seq_idx, which nothing passes). Transformers 5.25 refuses a packed batch where flash-linear-attention
cannot run (on CPUs: "can't keep packed sequences apart") instead of leaking. So:

    if has_linear_attention(model.config):
        kernels = select_kernels(device)   # flash-linear-attention / causal-conv1d if installed and correct, else PyTorch
        install(kernels)                   # the layer calls our two functions instead of transformers'
    model(input_ids=ids, position_ids=pos, **packed_kwargs(pos))   # cu_seq_lens_q/k, max_length_q/k

`install` replaces the module's two kernel entry points with functions that honour the sample boundaries:
the rule runs on the batch flattened to one row with cu_seqlens (fla), or sample by sample through
transformers' own reference implementation; the conv gets seq_idx (causal-conv1d), or a PyTorch conv over a
layout where each sample is preceded by its own zero padding. Without packed_kwargs both behave exactly as
transformers' own. Only qwen3_5 (dense) is patched.
"""
from __future__ import annotations

import inspect
import os
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from transformers.activations import ACT2FN
from transformers.models.qwen3_5 import modeling_qwen3_5

PATCHED = ("torch_chunk_gated_delta_rule", "causal_conv1d_fn")  # the names Qwen3_5GatedDeltaNet.forward calls
INSTALLED = []  # the Kernels install() put in place (the last one counts)


def _reference(name: str):
    """transformers' PyTorch implementation behind its kernel dispatch (the module global may be ours or fla's)."""
    function = getattr(modeling_qwen3_5, name)
    function = getattr(function, "original", function)  # ours, from an earlier install()
    reference = inspect.unwrap(function)
    if reference.__module__ != modeling_qwen3_5.__name__:
        raise RuntimeError(f"transformers' {name} is not its own PyTorch function ({reference.__module__}): this code "
                           "was written for transformers 5.17's qwen3_5; check the layer's kernel calls")
    return function, reference


ORIGINAL = {name: _reference(name)[0] for name in PATCHED}
TORCH_DELTA_RULE = _reference("torch_chunk_gated_delta_rule")[1]
TORCH_CONV = _reference("causal_conv1d_fn")[1]


# --------------------------------------------------------------------------------------------------
# Where the samples of a packed batch start
# --------------------------------------------------------------------------------------------------
def packed_kwargs(position_ids: torch.Tensor) -> dict:
    """cu_seq_lens_q/k (int32) and max_length_q/k for a [batch, length] batch of packed rows, as flash-attention
    varlen kernels take them: the rows flattened in order, a new sample wherever position_ids restart (or a
    row starts). position_ids must restart at 0 for each sample, as the recipe's pack() writes them."""
    if position_ids.ndim != 2:
        raise ValueError(f"position_ids must be [batch, length], not {tuple(position_ids.shape)}")
    flat = position_ids.reshape(-1)
    starts = (flat == 0).clone()
    starts[:: position_ids.shape[1]] = True  # every row starts a sample
    bounds = torch.cat([starts.nonzero().flatten(), flat.new_tensor([flat.numel()])])
    cu = bounds.to(device=position_ids.device, dtype=torch.int32)
    longest = int((bounds[1:] - bounds[:-1]).max())
    return {"cu_seq_lens_q": cu, "cu_seq_lens_k": cu, "max_length_q": longest, "max_length_k": longest}


# --------------------------------------------------------------------------------------------------
# The kernels: fast when installed and correct on this device, else transformers' PyTorch fallback
# --------------------------------------------------------------------------------------------------
@dataclass
class Kernels:
    delta_rule: object = None  # fla.ops.gated_delta_rule.chunk_gated_delta_rule, or None: PyTorch
    conv: object = None  # causal_conv1d.causal_conv1d_fn, or None: PyTorch
    why_not: list = field(default_factory=list)  # why a fast kernel is not used
    notes: list = field(default_factory=list)  # what the checks decided beyond the versions (a lifted refusal)

    def describe(self) -> str:
        fast = [n for n, k in (("flash-linear-attention", self.delta_rule), ("causal-conv1d", self.conv)) if k]
        return ("Gated DeltaNet kernels: " + (", ".join(fast) if fast else "none")
                + "".join(f" ({note})" for note in self.notes)
                + ("; PyTorch fallback (much slower) because " + "; ".join(self.why_not) if self.why_not else ""))


def has_linear_attention(config) -> bool:
    """Whether the model has Gated DeltaNet layers this module covers (transformers' qwen3_5 text model)."""
    types = getattr(config, "layer_types", None) or []
    if "linear_attention" in types and config.model_type != "qwen3_5_text":
        raise ValueError(f"{config.model_type} has linear-attention layers, but packing is made safe for Qwen3.5 "
                         "(qwen3_5_text) only: train it unpacked, or extend recipes/fsdp2_qwen3_multinode/linear_attention.py")
    return "linear_attention" in types


def select_kernels(device: torch.device, fast: bool = True, config=None, max_length: int = 192) -> Kernels:
    """The fast kernels that import and pass a packed forward + backward check against the PyTorch reference on
    this device, at the shapes `config` (a Qwen3.5 text config) and `max_length` give; else the fallback, with why.
    fla 0.6 refuses its gated backward on Hopper with Triton 3.4 to 3.7.1 (its issue 640: a miscompile found at some
    shapes); a check of every gradient at the recipe's own shapes decides instead (see check_lifting_hopper_refusal).
    fast=False: the fallback, on purpose."""
    kernels = Kernels()
    if not fast:
        kernels.why_not.append("the PyTorch kernels were asked for")
        return kernels
    if device.type != "cuda":
        kernels.why_not.append("no GPU")
        return kernels
    try:
        from fla.ops.common import chunk_o
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule

        shapes = {} if config is None else dict(heads=config.linear_num_value_heads, key_dim=config.linear_key_head_dim,
                                                value_dim=config.linear_value_head_dim)
        # fla's Triton kernels compile and autotune the first time they meet a shape, starting with this check (more
        # than 4 minutes on an H200 for the 27B's): Triton keeps the compiled kernels on disk (~/.triton/cache), and
        # with this its tuning choices too, so that later runs start at speed
        os.environ.setdefault("TRITON_CACHE_AUTOTUNING", "1")
        note = check_lifting_hopper_refusal(
            lambda: _check_delta_rule(chunk_gated_delta_rule, device, max_length=max_length, **shapes), chunk_o)
        kernels.delta_rule = chunk_gated_delta_rule
        kernels.notes += [note] if note else []
        kernels.notes.append("its kernels autotune the first time they meet a shape, for minutes; Triton's cache keeps the "
                             "result for later runs")
    except Exception as error:  # missing, refusing this GPU/Triton, or wrong: all mean the fallback
        kernels.why_not.append(f"flash-linear-attention: {type(error).__name__}: {str(error)[:200]}")
    try:
        from causal_conv1d import causal_conv1d_fn

        _check_conv(causal_conv1d_fn, device)
        kernels.conv = causal_conv1d_fn
    except Exception as error:
        kernels.why_not.append(f"causal-conv1d: {type(error).__name__}: {str(error)[:200]}")
    return kernels


def check_lifting_hopper_refusal(check, guard) -> str | None:
    """Run `check`; if fla refuses its gated backward (`chunk_bwd_dqkwg`) because this is Hopper with Triton 3.4 to
    3.7.1, lift that refusal (the flag `guard`, fla.ops.common.chunk_o, reads at every call) and run `check` again:
    the miscompile of its issue 640 shows as a wrong gradient, which the check measures at this run's shapes. Returns a
    note when the refusal was lifted; when the second check fails too, the refusal is put back and its error raised."""
    try:
        check()
        return None
    except RuntimeError as error:
        if "#640" not in str(error):
            raise
    guard.TRITON_ABOVE_3_7_1 = True
    try:
        check()
    except BaseException:
        guard.TRITON_ABOVE_3_7_1 = False
        raise
    return "fla's Hopper refusal below Triton 3.7.1 lifted: every gradient matched the reference at this run's shapes"


def install(kernels: Kernels) -> None:
    """Make every Qwen3_5GatedDeltaNet layer (built before or after) use `kernels` and honour packed samples."""

    def delta_rule(query, key, value, g, beta, *args, **kwargs):
        return chunk_gated_delta_rule(query, key, value, g, beta, *args, fla=kernels.delta_rule, **kwargs)

    def conv(hidden_states, weight, bias=None, activation=None, **kwargs):
        return causal_conv1d(hidden_states, weight, bias, activation, fast=kernels.conv, **kwargs)

    for name, function in (("torch_chunk_gated_delta_rule", delta_rule), ("causal_conv1d_fn", conv)):
        function.original = ORIGINAL[name]
        setattr(modeling_qwen3_5, name, function)
    INSTALLED.append(kernels)


def uninstall() -> None:
    for name in PATCHED:
        setattr(modeling_qwen3_5, name, ORIGINAL[name])
    INSTALLED.clear()


@torch.compiler.disable  # data-dependent sample boundaries: eager, between compiled regions
def chunk_gated_delta_rule(query, key, value, g, beta, chunk_size=64, initial_state=None, output_final_state=False,
                           use_qk_l2norm_in_kernel=False, cu_seqlens=None, fla=None, **ignored):
    """The gated delta rule of transformers' signature ([batch, length, heads, dim]); with `cu_seqlens` (the
    batch's rows flattened, as packed_kwargs gives it) the recurrent state starts from zero at every sample."""
    if cu_seqlens is not None and (initial_state is not None or output_final_state):
        raise ValueError("packed samples (cu_seq_lens_q) with a cache: the state would not restart at each sample; "
                         "train with use_cache=False (model.config.use_cache = False)")
    if cu_seqlens is None:
        if fla is not None:
            return fla(query, key, value, g=g, beta=beta, initial_state=initial_state,
                       output_final_state=output_final_state, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel)
        return TORCH_DELTA_RULE(query, key, value, g=g, beta=beta, chunk_size=chunk_size, initial_state=initial_state,
                                output_final_state=output_final_state, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel)
    batch, length = query.shape[:2]
    q, k, v, g, beta = (x.reshape(1, batch * length, *x.shape[2:]) for x in (query, key, value, g, beta))
    if fla is not None:
        out, _ = fla(q, k, v, g=g, beta=beta, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                     cu_seqlens=cu_seqlens.long())
    else:  # transformers' reference, one sample at a time: exactly what each sample gets alone
        bounds = cu_seqlens.tolist()
        out = torch.cat([TORCH_DELTA_RULE(q[:, a:b], k[:, a:b], v[:, a:b], g=g[:, a:b], beta=beta[:, a:b],
                                          chunk_size=chunk_size, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel)[0]
                         for a, b in zip(bounds, bounds[1:])], dim=1)
    return out.reshape(batch, length, *out.shape[2:]), None


@torch.compiler.disable
def causal_conv1d(hidden_states, weight, bias=None, activation=None, cu_seq_lens_q=None, fast=None, **ignored):
    """Depthwise causal conv of transformers' signature (hidden_states [batch, channels, length], weight
    [channels, width]); with `cu_seq_lens_q` no sample sees the tokens of the one before it."""
    if cu_seq_lens_q is None:
        if fast is not None:
            return fast(hidden_states, weight, bias, activation=activation)
        return TORCH_CONV(hidden_states, weight, bias, activation=activation)
    batch, channels, length = hidden_states.shape
    sample = torch.bucketize(torch.arange(batch * length, device=hidden_states.device), cu_seq_lens_q[1:].long(),
                             right=True)  # which sample each token of the flattened rows belongs to
    if fast is not None:  # causal-conv1d restarts wherever seq_idx changes
        seq_idx = sample.to(torch.int32).reshape(batch, length)
        return fast(hidden_states, weight, bias, seq_idx=seq_idx, activation=activation)
    width = weight.shape[-1]
    # Each sample gets its own width-1 zeros in front, as if convolved alone: token i moves to i + (width-1)(s+1).
    flat = hidden_states.transpose(0, 1).reshape(channels, batch * length).to(weight.dtype)
    target = torch.arange(batch * length, device=flat.device) + (width - 1) * (sample + 1)
    padded = flat.new_zeros(channels, batch * length + (width - 1) * (int(sample[-1]) + 1)).index_copy(1, target, flat)
    # index_select, not out[:, index]: its backward is an index_add, where advanced indexing's is a sorting index_put
    # (five times slower at the 27B's shape, 12 % of a packed step's GPU time)
    out = F.conv1d(padded[None], weight.unsqueeze(1), bias, groups=channels)[0].index_select(1, target - (width - 1))
    if activation is not None:
        out = ACT2FN[activation](out)
    return out.reshape(channels, batch, length).transpose(0, 1).to(hidden_states.dtype)


# --------------------------------------------------------------------------------------------------
# Correctness checks of the fast kernels (a packed forward + backward against the PyTorch reference)
# --------------------------------------------------------------------------------------------------
def _compare(fast_outputs, reference_outputs, names, what: str, tolerance: float = 0.03) -> None:
    """Refuse the fast kernel when any output or gradient is more than `tolerance` away from the reference's
    (relative L2 error: fla's good kernels measure 0.4-0.6 % in bf16)."""
    for name, fast, reference in zip(names, fast_outputs, reference_outputs):
        error = (fast.float() - reference.float()).norm() / reference.float().norm().clamp_min(1e-12)
        if not torch.isfinite(error) or error > tolerance:
            raise RuntimeError(f"{what}: {name} differs from the PyTorch reference by {float(error):.1%}")


def packed_lengths(max_length: int, chunk: int = 64) -> list[int]:
    """Sample lengths of one packed row of `max_length` tokens that exercise every case of a chunked kernel: a sample
    shorter than a chunk, one that ends inside a chunk, one that fills chunks exactly, and the longest the rest leaves."""
    short, ragged = max(1, chunk // 2 - 5), chunk + 13
    exact = chunk * max(1, (max_length - short - ragged) // (4 * chunk))
    return [short, ragged, exact, max_length - short - ragged - exact]


def _check_delta_rule(fla_rule, device, heads: int = 2, key_dim: int = 64, value_dim: int = 64,
                      max_length: int = 192) -> None:
    """Compare the output and every gradient (dq, dk, dv, dg, dbeta) of `fla_rule` with transformers' reference on rows
    shaped as the recipe runs them: its heads and head dims, one row of `max_length` tokens, then a packed row with
    samples of packed_lengths(max_length) (fla compiles the two cases apart)."""
    lengths, bounds = packed_lengths(max_length), [0]
    for length in lengths:
        bounds.append(bounds[-1] + length)
    for cu, what in ((None, f"one sample of {max_length} tokens"), (bounds, f"samples of {lengths} tokens")):
        _check_delta_rule_once(fla_rule, device, heads, key_dim, value_dim, max_length, cu,
                               f"flash-linear-attention's chunk_gated_delta_rule ({heads} heads of {key_dim}/"
                               f"{value_dim}, {what})")


def _check_delta_rule_once(fla_rule, device, heads, key_dim, value_dim, max_length, bounds, what) -> None:
    generator = torch.Generator(device=device).manual_seed(0)
    cu = None if bounds is None else torch.tensor(bounds, device=device, dtype=torch.int32)

    def random(*shape):
        return torch.randn(*shape, device=device, generator=generator)

    q, k = (random(1, max_length, heads, key_dim).bfloat16() for _ in range(2))
    v = random(1, max_length, heads, value_dim).bfloat16()
    g = -F.softplus(random(1, max_length, heads))  # the log decay, fp32 as the model computes it
    beta = random(1, max_length, heads).sigmoid().bfloat16()
    results = []
    for fla in (fla_rule, None):
        inputs = [x.detach().clone().requires_grad_() for x in (q, k, v, g, beta)]
        out, _ = chunk_gated_delta_rule(*inputs, use_qk_l2norm_in_kernel=True, cu_seqlens=cu, fla=fla)
        out.float().pow(2).sum().backward()
        results.append([out, *(x.grad for x in inputs)])
    _compare(*results, ("output", "dq", "dk", "dv", "dg", "dbeta"), what)


def _check_conv(conv_fn, device) -> None:
    generator = torch.Generator(device=device).manual_seed(0)
    channels, width = 64, 4
    x = torch.randn(1, 128, channels, device=device, generator=generator).bfloat16().transpose(1, 2)  # channel-last
    weight = torch.randn(channels, width, device=device, generator=generator).bfloat16()
    cu = torch.tensor([0, 50, 128], device=device, dtype=torch.int32)
    results = []
    for fast in (conv_fn, None):
        inputs = x.detach().clone().requires_grad_()
        out = causal_conv1d(inputs, weight, None, "silu", cu_seq_lens_q=cu, fast=fast)
        out.float().pow(2).sum().backward()
        results.append((out, inputs.grad))
    _compare(*results, ("output", "grad"), "causal-conv1d's causal_conv1d_fn")
