"""Run TRL's trainers without a GPU: TRL (>= 1.x) scores tokens with a Triton kernel, which needs CUDA.

TRL's SFT/DPO/KTO/GRPO trainers patch the model with a fused LM head whose per-token log-probabilities come
from `trl.kernels.ChunkedLogProbFunction`, a Triton kernel; on a CPU it fails with "0 active drivers".
`use_torch_logprobs_on_cpu()` swaps in the same function written in plain PyTorch (full logits, fine for the
small models of CPU tests). It does nothing when CUDA is available, so GPU runs keep TRL's kernel.

    from nbhelpers.trl_cpu import use_torch_logprobs_on_cpu
    use_torch_logprobs_on_cpu()      # before trainer.train()
"""
from __future__ import annotations

import torch


def _per_token(hidden, weight, bias, targets, temperature, softcap, logit_scale, outputs):
    logits = hidden.float() @ weight.float().t()
    if bias is not None:
        logits = logits + bias.float()
    logits = logits * logit_scale
    if softcap is not None:
        logits = softcap * torch.tanh(logits / softcap)
    logits = logits / temperature
    log_z = torch.logsumexp(logits, dim=-1)
    log_probs = logits.gather(-1, targets[:, None]).squeeze(-1) - log_z
    entropy = log_sum_sq = mean = top1 = None
    if "entropy" in outputs:
        entropy = log_z - (torch.softmax(logits, -1) * logits).sum(-1)
    if "log_sum_sq_probs" in outputs:
        log_sum_sq = torch.logsumexp(2 * (logits - log_z[:, None]), dim=-1)
    if "mean_logits" in outputs:
        mean = logits.mean(-1)
    if "is_top1" in outputs:
        top1 = logits.argmax(-1) == targets
    return log_probs, entropy, log_sum_sq, mean, top1


class TorchChunkedLogProbFunction(torch.autograd.Function):
    """`trl.kernels.ChunkedLogProbFunction` (same arguments, same outputs) in PyTorch ops.

    Like the kernel, the backward recomputes the logits and re-enters TRL's ZeRO-3 gather of the LM head,
    whose weight is released again after the forward.
    """

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, temperature, chunk_size, final_logit_softcapping=None,
                logit_scale=1.0, outputs=("log_probs",)):
        ctx.set_materialize_grads(False)
        ctx.settings = (temperature, final_logit_softcapping, logit_scale)
        ctx.save_for_backward(hidden, weight, bias, targets)
        with torch.no_grad():
            results = _per_token(hidden, weight, bias, targets, temperature, final_logit_softcapping, logit_scale,
                                 outputs)
        log_probs, entropy = results[0].to(hidden.dtype), results[1]
        entropy = entropy.to(hidden.dtype) if entropy is not None else None
        ctx.mark_non_differentiable(*(x for x in results[2:] if x is not None))
        return (log_probs, entropy, *results[2:])

    @staticmethod
    def backward(ctx, grad_log_probs, grad_entropy, *_):
        from trl.trainer.utils import maybe_gather_lm_head_ctx

        hidden, weight, bias, targets = ctx.saved_tensors
        temperature, softcap, logit_scale = ctx.settings
        needs = ctx.needs_input_grad[:3]
        with maybe_gather_lm_head_ctx(weight, bias), torch.enable_grad():
            leaves = [x.detach().requires_grad_(need) if x is not None else None
                      for x, need in zip((hidden, weight, bias), needs)]
            log_probs, entropy, *_ = _per_token(*leaves, targets, temperature, softcap, logit_scale,
                                                ("entropy",) if grad_entropy is not None else ())
            pairs = [(out, grad) for out, grad in ((log_probs, grad_log_probs), (entropy, grad_entropy))
                     if grad is not None]
            wanted = [leaf for leaf, need in zip(leaves, needs) if need and leaf is not None]
            grads = iter(torch.autograd.grad([o for o, _ in pairs], wanted, [g.float() for _, g in pairs],
                                             allow_unused=True) if pairs and wanted else ())
            result = [next(grads) if need and leaf is not None else None for leaf, need in zip(leaves, needs)]
        result = [g.to(x.dtype) if g is not None else None for g, x in zip(result, (hidden, weight, bias))]
        return (*result, None, None, None, None, None, None)


def use_torch_logprobs_on_cpu() -> bool:
    """Without CUDA, make TRL's fused LM head use `TorchChunkedLogProbFunction`; return whether it did."""
    if torch.cuda.is_available():
        return False
    import trl.trainer.utils

    trl.trainer.utils._ChunkedLogProbFunction = TorchChunkedLogProbFunction
    return True
