"""Score document -> JSON extraction (the invoice/receipt task): JSON validity and field-level exact match.

    from nbhelpers.extraction import score_extractions
    scores = score_extractions(predicted_texts, expected_jsons)
    # {"documents": 100, "json_valid": 0.97, "field_exact_match": 0.91, "document_exact_match": 0.80}

A prediction may wrap its JSON in prose or a ```json fence (as chat models do); the first JSON object
in it is scored. A field matches when the predicted value equals the expected one after trimming
whitespace (numbers and strings compare by their text, so 12.5 matches "12.50" only if written alike).
"""
from __future__ import annotations

import json
import re

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
