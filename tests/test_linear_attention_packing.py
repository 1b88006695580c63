"""Packing for Qwen3.5's Gated DeltaNet layers (recipes/fsdp2_qwen3_multinode/linear_attention.py), on CPU
with the tiny stand-in: transformers alone refuses a packed batch on CPUs (5.25; 5.17 leaked one sample into the
next); with the recipe's kernels a packed batch gives every sample the loss and the gradients it gets alone."""
import importlib.util
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[1]
LENGTHS = (70, 130, 20)  # 70 and 130 span two and three chunks of 64 in the delta rule


@pytest.fixture(scope="module")
def linear_attention():
    path = REPO / "recipes" / "fsdp2_qwen3_multinode" / "linear_attention.py"
    spec = importlib.util.spec_from_file_location("recipe_linear_attention", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    yield module
    module.uninstall()


@pytest.fixture(scope="module")
def model(standin):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(standin("qwen3.5-27b"), attn_implementation="sdpa").float()


def samples(vocab_size):
    generator = torch.Generator().manual_seed(0)
    return [torch.randint(0, vocab_size, (n,), generator=generator) for n in LENGTHS]


def packed_batch(parts, row_length):
    """Two rows: the first two samples in row 0, the third in row 1, each row padded with a segment of its own."""
    rows, positions = [], []
    for row in (parts[:2], parts[2:]):
        pad = row_length - sum(len(p) for p in row)
        rows.append(torch.cat([*row, torch.zeros(pad, dtype=torch.long)]))
        positions.append(torch.cat([torch.arange(len(p)) for p in row] + [torch.arange(pad)]))
    return torch.stack(rows), torch.stack(positions)


def per_sample_logits(logits, positions):
    """Each sample's logits (not the padding segments) from a [rows, length] forward of packed_batch()."""
    pieces = []
    for row in range(logits.shape[0]):
        starts = (positions[row] == 0).nonzero().flatten().tolist() + [logits.shape[1]]
        pieces += [logits[row, a:b] for a, b in zip(starts, starts[1:])]
    return pieces[:2] + pieces[3:4]  # row 0: sample, sample, padding; row 1: sample, padding


def losses(logits, parts):
    """Summed next-token loss of each sample."""
    return [F.cross_entropy(x[:-1], p[1:], reduction="sum") for x, p in zip(logits, parts)]


def forward_packed(model, linear_attention, parts):
    ids, positions = packed_batch(parts, 220)
    logits = model(input_ids=ids, position_ids=positions, use_cache=False,
                   **linear_attention.packed_kwargs(positions)).logits
    return per_sample_logits(logits, positions)


def forward_alone(model, parts):
    return [model(input_ids=p[None], use_cache=False).logits[0] for p in parts]


def test_without_the_fix_transformers_cannot_keep_packed_samples_apart_on_cpu(model, linear_attention):
    """Transformers 5.25 refuses a packed batch where flash-linear-attention cannot run (CPUs); 5.17 took it and leaked
    one sample into the next (the conv read the previous sample's last tokens, the recurrent state flowed on)."""
    linear_attention.uninstall()
    parts = samples(model.config.vocab_size)
    with torch.no_grad(), pytest.raises(ValueError, match="can't keep packed sequences apart"):
        forward_packed(model, linear_attention, parts)


def test_packed_samples_get_the_logits_loss_and_gradients_they_get_alone(model, linear_attention):
    linear_attention.install(linear_attention.select_kernels(torch.device("cpu")))
    parts = samples(model.config.vocab_size)
    model.zero_grad()
    packed_logits = forward_packed(model, linear_attention, parts)
    packed = losses(packed_logits, parts)
    torch.stack(packed).sum().backward()
    packed_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    single_logits = forward_alone(model, parts)
    single = losses(single_logits, parts)
    torch.stack(single).sum().backward()
    # fp32 on CPU, the same arithmetic per sample; only the matmul shapes differ (rounding, ~1e-7 relative)
    for a, b in zip(packed_logits, single_logits):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    assert [x.item() for x in packed] == pytest.approx([x.item() for x in single], rel=1e-6)
    for packed_grad, parameter in zip(packed_grads, model.parameters()):
        torch.testing.assert_close(packed_grad, parameter.grad, rtol=1e-4, atol=1e-6)


def test_packed_samples_with_a_cache_are_refused_with_advice(model, linear_attention):
    linear_attention.install(linear_attention.select_kernels(torch.device("cpu")))
    ids, positions = packed_batch(samples(model.config.vocab_size), 220)
    with torch.no_grad(), pytest.raises(ValueError, match="use_cache=False"):
        model(input_ids=ids, position_ids=positions, use_cache=True, **linear_attention.packed_kwargs(positions))


def test_varlen_conv_convolves_each_sample_as_if_alone(linear_attention):
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(2, 40, 8, generator=generator).transpose(1, 2)  # [batch, channels, length], channel-last as in the layer
    weight = torch.randn(8, 4, generator=generator)
    cu = torch.tensor([0, 3, 25, 40, 52, 80], dtype=torch.int32)  # row 0: 3 + 22 + 15 tokens; row 1: 12 + 28
    out = linear_attention.causal_conv1d(x, weight, None, "silu", cu_seq_lens_q=cu)
    flat_x = x.transpose(0, 1).reshape(8, 80)
    flat_out = out.transpose(0, 1).reshape(8, 80)
    for a, b in zip(cu.tolist(), cu.tolist()[1:]):
        expected = linear_attention.TORCH_CONV(flat_x[None, :, a:b], weight, None, activation="silu")[0]
        torch.testing.assert_close(flat_out[:, a:b], expected)


def test_packed_kwargs_mark_every_sample_of_every_row(linear_attention):
    positions = torch.tensor([[0, 1, 2, 0, 1], [0, 1, 0, 1, 2]])
    kwargs = linear_attention.packed_kwargs(positions)
    assert kwargs["cu_seq_lens_q"].tolist() == [0, 3, 5, 7, 10] and kwargs["cu_seq_lens_q"].dtype == torch.int32
    assert kwargs["max_length_q"] == kwargs["max_length_k"] == 3
    # a row that continues a sample's positions still starts a new sample
    assert linear_attention.packed_kwargs(torch.tensor([[0, 1], [2, 3]]))["cu_seq_lens_q"].tolist() == [0, 2, 4]


def test_without_a_gpu_the_fallback_is_chosen_and_the_reason_said_in_one_line(linear_attention):
    kernels = linear_attention.select_kernels(torch.device("cpu"))
    assert kernels.delta_rule is None and kernels.conv is None
    line = kernels.describe()
    assert "\n" not in line and "PyTorch fallback" in line and "no GPU" in line


class _ScaleGradient(torch.autograd.Function):
    """Identity forward; the gradient scaled: a kernel wrong in one gradient only (as a miscompiled backward is)."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad * 1.5


def _a_kernel_like_fla(linear_attention, wrong_in=None):
    """fla's call signature over transformers' reference, sample by sample (exact); `wrong_in` names the one input
    ("q", "k", "v", "g", "beta") whose gradient it gets wrong."""
    def kernel(q, k, v, g, beta, use_qk_l2norm_in_kernel, cu_seqlens=None, initial_state=None,
               output_final_state=False):
        given = dict(q=q, k=k, v=v, g=g, beta=beta)
        if wrong_in:
            given[wrong_in] = _ScaleGradient.apply(given[wrong_in])
        return linear_attention.chunk_gated_delta_rule(
            given["q"], given["k"], given["v"], given["g"], given["beta"], initial_state=initial_state,
            output_final_state=output_final_state, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
            cu_seqlens=cu_seqlens)
    return kernel


def test_the_start_up_check_passes_a_kernel_that_matches_the_reference(linear_attention):
    linear_attention._check_delta_rule(_a_kernel_like_fla(linear_attention), torch.device("cpu"), heads=2,
                                       key_dim=32, value_dim=48, max_length=256)


@pytest.mark.parametrize("wrong_in", ["q", "k", "v", "g", "beta"])
def test_the_start_up_check_refuses_a_kernel_wrong_in_any_one_gradient(linear_attention, wrong_in):
    with pytest.raises(RuntimeError, match=f"d{wrong_in} differs from the PyTorch reference by 50.0%"):
        linear_attention._check_delta_rule(_a_kernel_like_fla(linear_attention, wrong_in), torch.device("cpu"),
                                           heads=2, key_dim=32, value_dim=48, max_length=256)


def test_the_check_runs_the_recipes_lengths_with_every_chunk_case(linear_attention):
    lengths = linear_attention.packed_lengths(4096)
    assert sum(lengths) == 4096
    assert lengths[0] < 64 and lengths[1] % 64 and lengths[2] % 64 == 0 and lengths[3] > 1024


class _Guard:
    """fla.ops.common.chunk_o's flag, as fla 0.6 reads it on Hopper with Triton 3.6."""
    TRITON_ABOVE_3_7_1 = False


def _a_refusing_kernel(linear_attention, guard, wrong_in=None):
    """A kernel that raises fla's issue-640 refusal until `guard` is lifted (then exact, or wrong in one gradient)."""
    kernel = _a_kernel_like_fla(linear_attention, wrong_in)

    def refusing(*args, **kwargs):
        if not guard.TRITON_ABOVE_3_7_1:
            raise RuntimeError("Triton >= 3.4.0 and < 3.7.1 on Hopper GPUs produces incorrect results for gated "
                               "chunk_bwd_dqkwg (see #640).")
        return kernel(*args, **kwargs)
    return refusing


def _check(linear_attention, kernel):
    return lambda: linear_attention._check_delta_rule(kernel, torch.device("cpu"), heads=2, key_dim=32, value_dim=48,
                                                      max_length=256)


def test_fla_s_hopper_refusal_is_lifted_when_every_gradient_matches_at_the_run_s_shapes(linear_attention):
    guard = _Guard()
    note = linear_attention.check_lifting_hopper_refusal(
        _check(linear_attention, _a_refusing_kernel(linear_attention, guard)), guard)
    assert guard.TRITON_ABOVE_3_7_1 and "refusal below Triton 3.7.1 lifted" in note


def test_fla_s_hopper_refusal_stays_when_a_gradient_is_wrong_and_the_error_names_it(linear_attention):
    guard = _Guard()
    with pytest.raises(RuntimeError, match="dg differs from the PyTorch reference by 50.0%"):
        linear_attention.check_lifting_hopper_refusal(
            _check(linear_attention, _a_refusing_kernel(linear_attention, guard, wrong_in="g")), guard)
    assert not guard.TRITON_ABOVE_3_7_1


def test_a_kernel_that_passes_without_a_refusal_is_taken_as_it_is(linear_attention):
    guard = _Guard()
    assert linear_attention.check_lifting_hopper_refusal(_check(linear_attention, _a_kernel_like_fla(linear_attention)),
                                                         guard) is None
    assert not guard.TRITON_ABOVE_3_7_1
