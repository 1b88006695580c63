"""Train the stand-ins' byte-level BPE on the text sets of data/ (offline, deterministic).

    python data/make_tokenizer.py       # rewrites tests/standin_assets/tokenizer.json

The base vocabulary is shared by every model family; `tests/standins.py` adds each family's special
tokens and chat template on top. Digits are split one by one (as Qwen and Llama 3 pre-tokenize
numbers into short groups), so the arithmetic in the datasets stays learnable by tiny models.
Run it after data/make_text_datasets.py whenever the text sets change.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

DATA = Path(__file__).resolve().parent
OUT = DATA.parent / "tests" / "standin_assets" / "tokenizer.json"
VOCAB_SIZE = 4096
# Qwen2's pre-tokenization pattern: words with their leading space, single digits, punctuation runs.
PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
           r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def strings(value):
    """Every string inside a JSON row (field names excluded)."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from strings(item)


def texts():
    sys.path.insert(0, str(DATA))
    from make_text_datasets import DATASETS

    for name in DATASETS:  # a fixed order, so training is reproducible
        with (DATA / name / "train.jsonl").open(encoding="utf-8") as f:
            for line in f:
                yield from strings(json.loads(line))


def main() -> None:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PATTERN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tokenizer.train_from_iterator(texts(), trainer)
    tokenizer.save(str(OUT))
    print(f"{OUT}: {tokenizer.get_vocab_size()} tokens, {OUT.stat().st_size / 1e3:.0f} kB")


if __name__ == "__main__":
    main()
