"""Packed rows for GPT-OSS: each conversation attends only to itself.

TRL's padding-free packing (`SFTConfig(packing=True)`) puts several conversations in one row, with no padding, and
restarts the position ids at the start of each. Transformers finds those starts in the position ids when it builds
the attention masks (`create_causal_mask(..., position_ids=...)`), and Llama's forward passes them; GptOssModel's
forward (Transformers 5.17 to 5.25) does not, so in a packed row every conversation attends to the ones before it.
`mask_packed_sequences` builds GPT-OSS's two masks (full and sliding-window) from the position ids before its forward
and hands them over as the prepared masks it accepts. Remove it once GptOssModel passes `position_ids` to its masks
(`tests/test_gpt_oss_compile_and_packing.py` fails then, to say so).
"""
from __future__ import annotations

import torch
from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask


def mask_packed_sequences(model: torch.nn.Module) -> torch.utils.hooks.RemovableHandle:
    """Make `model` (a GPT-OSS causal LM, bare or under PEFT) keep the sequences of a packed row apart.

    Calls that bring an attention mask (padded batches, `generate`) or a cache are left as they are."""
    decoder = model.get_base_model().model if hasattr(model, "get_base_model") else model.model

    def with_packed_masks(module, args, kwargs):
        position_ids = kwargs.get("position_ids")
        # The cache's keyword: `past_key_values` up to Transformers 5.23, `cache` from 5.24 (which takes both)
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        if position_ids is None or kwargs.get("attention_mask") is not None or cache is not None:
            return None
        # The mask functions read only the batch size, length, dtype and device of the embeddings. Their fourth
        # argument, the cache (None), is given by position: its name is the one above that changed.
        shape = torch.empty(*position_ids.shape, 0, dtype=module.dtype, device=position_ids.device)
        inputs = (module.config, shape, None, None)  # config, inputs_embeds, attention_mask, cache
        kwargs["attention_mask"] = {"full_attention": create_causal_mask(*inputs, position_ids=position_ids),
                                    "sliding_attention": create_sliding_window_causal_mask(*inputs,
                                                                                           position_ids=position_ids)}
        return args, kwargs

    return decoder.register_forward_pre_hook(with_packed_masks, with_kwargs=True)
