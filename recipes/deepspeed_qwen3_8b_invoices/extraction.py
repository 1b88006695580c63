"""The invoice recipe's held-out evaluation: greedy replies to the test documents, scored for JSON validity,
field-level exact match and document exact match (every field right, no extra key).

    python extraction.py --model_name_or_path runs/qwen3_8b_invoices/final_model --dataset_name ../../data/invoices

Generation uses the chat template with thinking disabled (enable_thinking=False), as in training. A reply may
wrap its JSON in prose or a ```json fence (as chat models do): the first JSON object in it is scored; Qwen3's
(empty) think block is not part of the answer. A field matches when the predicted value equals the expected one
after trimming whitespace (numbers and strings compare by their text, so 12.5 matches "12.50" only if written
alike).
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import torch

_FENCE = re.compile(r"```(?:json)?\s*(.*?)```", re.DOTALL)


def parse_json_object(text: str) -> dict | None:
    """The first JSON object in `text` (inside a code fence or bare), or None if there is none."""
    fenced = _FENCE.search(text)
    if fenced:
        text = fenced.group(1)
    decoder = json.JSONDecoder()
    for start in (i for i, ch in enumerate(text) if ch == "{"):
        try:
            value, _ = decoder.raw_decode(text, start)
        except json.JSONDecodeError:
            continue
        if isinstance(value, dict):
            return value
    return None


def _normalise(value) -> str:
    return value.strip() if isinstance(value, str) else json.dumps(value)


def score_extraction(predicted: str, expected: str | dict) -> dict:
    """One document: {"json_valid", "fields", "fields_matched", "exact"} (exact: every field matched, no extra key)."""
    expected = json.loads(expected) if isinstance(expected, str) else expected
    prediction = parse_json_object(predicted)
    if prediction is None:
        return {"json_valid": False, "fields": len(expected), "fields_matched": 0, "exact": False}
    matched = sum(key in prediction and _normalise(prediction[key]) == _normalise(value)
                  for key, value in expected.items())
    exact = matched == len(expected) and set(prediction) == set(expected)
    return {"json_valid": True, "fields": len(expected), "fields_matched": matched, "exact": exact}


def score_extractions(predicted: list[str], expected: list[str | dict]) -> dict:
    """Many documents: JSON validity rate, field-level exact match (over all fields), document exact match."""
    if len(predicted) != len(expected):
        raise ValueError(f"{len(predicted)} predictions for {len(expected)} expected documents")
    return summarize([score_extraction(p, e) for p, e in zip(predicted, expected)])


def summarize(scores: list[dict]) -> dict:
    """The rates over documents scored one by one with `score_extraction`."""
    documents, fields = len(scores), sum(s["fields"] for s in scores)
    return {
        "documents": documents,
        "json_valid": sum(s["json_valid"] for s in scores) / max(documents, 1),
        "field_exact_match": sum(s["fields_matched"] for s in scores) / max(fields, 1),
        "document_exact_match": sum(s["exact"] for s in scores) / max(documents, 1),
    }


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

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # recipes/: recipe_common.py
    from recipe_common import load_rows

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model_name_or_path", required=True)
    parser.add_argument("--dataset_name", default="data/invoices", help="hub id or folder with test.jsonl")
    parser.add_argument("--max_predict_samples", type=int, default=100, help="test rows to score")
    parser.add_argument("--max_new_tokens", type=int, default=160)
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = AutoModelForCausalLM.from_pretrained(args.model_name_or_path,
                                                 dtype=torch.bfloat16 if device == "cuda" else None)
    rows = load_rows(args.dataset_name, "test").select(range(args.max_predict_samples))
    scores = evaluate_rows(model.to(device), AutoTokenizer.from_pretrained(args.model_name_or_path), rows,
                           args.max_new_tokens)
    print(json.dumps(summarize(scores), indent=2))


if __name__ == "__main__":
    main()
