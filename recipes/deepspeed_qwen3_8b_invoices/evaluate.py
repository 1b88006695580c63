"""Held-out evaluation of invoice/receipt extraction: JSON validity and field-level exact match.

    python evaluate.py --model runs/qwen3_8b_invoices/final_model --data ../../data/invoices --samples 100

Greedy generation with the chat template and thinking disabled (enable_thinking=False), as in training.
A reply scores per field: a field is right when the reply is a JSON object whose value for that key equals
the reference's (as strings, surrounding spaces ignored). `exact` means every field right and no extra key.
"""
from __future__ import annotations

import argparse
import json
import re

import torch

_FENCE = re.compile(r"^```(?:json)?\s*|\s*```$")
_THINK = re.compile(r"^\s*<think>.*?</think>\s*", re.DOTALL)


def score_extraction(reply: str, reference: dict) -> dict:
    """{valid_json, fields, fields_correct, exact} for one reply against the reference fields."""
    text = _FENCE.sub("", _THINK.sub("", reply).strip()).strip()
    try:
        predicted = json.loads(text)
    except json.JSONDecodeError:
        predicted = None
    valid = isinstance(predicted, dict)
    correct = sum(1 for key, value in reference.items()
                  if valid and key in predicted and str(predicted[key]).strip() == str(value).strip())
    return {"valid_json": valid, "fields": len(reference), "fields_correct": correct,
            "exact": valid and correct == len(reference) and set(predicted) == set(reference)}


def summarize(scores: list[dict]) -> dict:
    n = len(scores)
    fields = sum(s["fields"] for s in scores)
    return {"samples": n,
            "json_valid_rate": sum(s["valid_json"] for s in scores) / n if n else None,
            "field_exact_match": sum(s["fields_correct"] for s in scores) / fields if fields else None,
            "document_exact_match": sum(s["exact"] for s in scores) / n if n else None}


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
        score = score_extraction(reply, json.loads(row["completion"][0]["content"]))
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
