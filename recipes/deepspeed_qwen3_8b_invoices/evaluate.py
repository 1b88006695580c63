"""Held-out evaluation of invoice/receipt extraction: JSON validity and field-level exact match.

    python evaluate.py --model runs/qwen3_8b_invoices/final_model --data ../../data/invoices --samples 100

Greedy generation with the chat template and thinking disabled (enable_thinking=False), as in training.
Scored with the cookbook's extraction scorer (`nbhelpers.extraction`, also used on `data/invoices`): JSON
validity, field-level exact match, and document exact match (every field right, no extra key).
"""
from __future__ import annotations

import argparse
import json
import re

import torch

from nbhelpers.extraction import score_extraction, summarize

_THINK = re.compile(r"^\s*<think>.*?</think>\s*", re.DOTALL)


def score_reply(reply: str, completion: str) -> dict:
    """One reply against the reference completion's JSON; Qwen3's (empty) think block is not part of the answer."""
    return score_extraction(_THINK.sub("", reply), completion)


@torch.no_grad()
def generate_replies(model, tokenizer, prompts: list[list[dict]], max_new_tokens: int, batch_size: int) -> list[str]:
    """Greedy replies to chat prompts, batched with left padding."""
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    texts = [tokenizer.apply_chat_template(p, add_generation_prompt=True, enable_thinking=False, tokenize=False)
             for p in prompts]
    replies = []
    model.eval()
    for start in range(0, len(texts), batch_size):
        batch = tokenizer(texts[start:start + batch_size], return_tensors="pt", padding=True,
                          add_special_tokens=False).to(model.device)
        out = model.generate(**batch, max_new_tokens=max_new_tokens, do_sample=False,
                             pad_token_id=tokenizer.pad_token_id)
        replies += tokenizer.batch_decode(out[:, batch["input_ids"].shape[1]:], skip_special_tokens=True)
    return replies


def evaluate_rows(model, tokenizer, rows, max_new_tokens: int = 160, batch_size: int = 8) -> list[dict]:
    """Score the model on prompt/completion rows (the completion's content is the reference JSON)."""
    replies = generate_replies(model, tokenizer, [row["prompt"] for row in rows], max_new_tokens, batch_size)
    scores = []
    for row, reply in zip(rows, replies):
        score = score_reply(reply, row["completion"][0]["content"])
        scores.append({**score, "reply": reply[:300]})
    return scores


def main():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from nbhelpers.recipes import load_rows

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--data", default="data/invoices", help="hub id or folder with test.jsonl")
    parser.add_argument("--samples", type=int, default=100)
    parser.add_argument("--max_new_tokens", type=int, default=160)
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.bfloat16 if device == "cuda" else None)
    rows = load_rows(args.data, "test").select(range(args.samples))
    scores = evaluate_rows(model.to(device), AutoTokenizer.from_pretrained(args.model), rows, args.max_new_tokens)
    print(json.dumps(summarize(scores), indent=2))


if __name__ == "__main__":
    main()
