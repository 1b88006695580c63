"""The project's text datasets: loaded through their real loading call, in the shape of the hub sets they
stand in for, reproducible from their script, and learnable by a tiny stand-in on CPU."""
import collections
import json
import math
import sys
from pathlib import Path

import pytest
import torch
from datasets import load_dataset
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl.chat_template_utils import get_training_chat_template

DATA = Path(__file__).resolve().parents[1] / "data"
sys.path.insert(0, str(DATA))
import make_text_datasets  # noqa: E402

sys.path.insert(0, str(DATA.parent / "recipes" / "deepspeed_qwen3_8b_invoices"))
from extraction import parse_json_object, score_extractions  # noqa: E402  (the invoice recipe's scorer)

COLUMNS = {
    "multilingual_thinking": {"reasoning_language", "developer", "user", "analysis", "final", "messages"},
    "capybara": {"messages"},
    "finetome": {"conversations", "source", "score"},
    "alpaca": {"instruction", "input", "output", "text"},
    "alpaca_messages": {"messages"},
    "invoices": {"prompt", "completion"},
}


def load(name):
    return load_dataset("json", data_files={split: str(DATA / name / f"{split}.jsonl") for split in ("train", "test")})


def test_every_text_set_is_documented_and_has_its_columns():
    assert set(COLUMNS) == set(make_text_datasets.DATASETS)
    readme = (DATA / "README.md").read_text()
    for name, (_, n_train, n_test, _) in make_text_datasets.DATASETS.items():
        dataset = load(name)
        assert set(dataset["train"].column_names) == COLUMNS[name]
        assert (dataset["train"].num_rows, dataset["test"].num_rows) == (n_train, n_test)
        assert f"`{name}/`" in readme


@pytest.mark.parametrize("name", sorted(COLUMNS))
def test_committed_files_are_what_the_script_makes_and_test_rows_are_unseen(name):
    make_example, n_train, n_test, seed = make_text_datasets.DATASETS[name]
    train, test = make_text_datasets.make_splits(make_example, n_train, n_test, seed)
    for split, rows in (("train", train), ("test", test)):
        lines = (DATA / name / f"{split}.jsonl").read_text(encoding="utf-8").splitlines()
        assert [json.loads(line) for line in lines] == rows, f"regenerate with python data/make_text_datasets.py"
    seen = {json.dumps(row, sort_keys=True) for row in train}
    assert not any(json.dumps(row, sort_keys=True) in seen for row in test)


def test_reasoning_rows_have_the_multilingual_thinking_shape():
    rows = load("multilingual_thinking")["train"]
    assert len(set(rows["reasoning_language"])) == 5
    for row in rows.select(range(50)):
        system, user, assistant = row["messages"]
        assert row["developer"] == f"reasoning language: {row['reasoning_language']}" == system["content"]
        assert (system["role"], user["role"], assistant["role"]) == ("system", "user", "assistant")
        assert (user["content"], assistant["content"], assistant["thinking"]) == (row["user"], row["final"], row["analysis"])
        assert user["thinking"] is None


def test_conversation_sets_alternate_user_and_assistant():
    for row in load("capybara")["train"].select(range(100)):
        assert [m["role"] for m in row["messages"]] == ["user", "assistant"] * (len(row["messages"]) // 2)
    for row in load("finetome")["train"].select(range(100)):
        assert [m["from"] for m in row["conversations"]] == ["human", "gpt"] * (len(row["conversations"]) // 2)
        assert 4.0 <= row["score"] <= 5.2
    for row in load("alpaca")["train"].select(range(100)):
        assert row["text"].endswith(f"### Response:\n{row['output']}")
        assert ("### Input:" in row["text"]) == bool(row["input"])


def test_invoice_completions_are_json_and_score_perfectly_against_themselves():
    test = load("invoices")["test"]
    expected = [row["completion"][0]["content"] for row in test]
    assert all(row["prompt"][0]["role"] == "user" and row["completion"][0]["role"] == "assistant" for row in test)
    assert {json.loads(e)["document_type"] for e in expected} == {"invoice", "receipt"}
    perfect = score_extractions(expected, expected)
    assert perfect == {"documents": len(test), "json_valid": 1.0, "field_exact_match": 1.0, "document_exact_match": 1.0}


def test_extraction_score_counts_fields_validity_and_fenced_json():
    expected = {"vendor": "Book Nook", "date": "2024-01-18", "total": "1.80"}
    predictions = [
        '```json\n{"vendor": "Book Nook", "date": "2024-01-18", "total": "1.80"}\n```',  # fenced, all right
        'Here it is: {"vendor": "Book Nook", "date": "18/01/2024", "total": "1.80"}',  # one field wrong
        '{"vendor": "Book Nook", "date": ',  # not JSON
    ]
    scores = score_extractions(predictions, [expected] * 3)
    assert scores["json_valid"] == pytest.approx(2 / 3)
    assert scores["field_exact_match"] == pytest.approx(5 / 9)
    assert scores["document_exact_match"] == pytest.approx(1 / 3)
    assert parse_json_object("no json here") is None


def test_extraction_with_an_extra_key_matches_every_field_but_is_not_exact():
    expected = {"vendor": "Acme", "total": "12.50"}
    scores = score_extractions(['{"vendor": "Acme", "total": "12.50", "note": "paid"}'], [expected])
    assert scores["field_exact_match"] == 1.0 and scores["document_exact_match"] == 0.0


def _encode(tokenizer, rows):
    """Token ids and assistant-only labels of each conversation (the model learns the reasoning and answer), with
    the template TRL's assistant-only loss swaps in for the hub model's."""
    encoded, template = [], get_training_chat_template(tokenizer)
    for messages in rows["messages"]:
        rendered = tokenizer.apply_chat_template(messages, chat_template=template, return_dict=True,
                                                 return_assistant_tokens_mask=True)
        ids = torch.tensor(rendered["input_ids"])
        encoded.append((ids, torch.where(torch.tensor(rendered["assistant_masks"]).bool(), ids, -100)))
    return encoded


def _batch(pairs, pad_id):
    length = max(len(ids) for ids, _ in pairs)
    input_ids = torch.full((len(pairs), length), pad_id)
    labels = torch.full((len(pairs), length), -100)
    for i, (ids, target) in enumerate(pairs):
        input_ids[i, : len(ids)], labels[i, : len(ids)] = ids, target
    return input_ids, labels


@pytest.fixture
def one_thread():
    # Matrices this small gain nothing from intra-op threads, and on a busy machine spinning threads cost 4x.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_tiny_gpt_oss_learns_the_reasoning_set_beyond_token_frequencies(standin, one_thread):
    torch.manual_seed(0)
    path = standin("gpt-oss-20b")
    tokenizer, model = AutoTokenizer.from_pretrained(path), AutoModelForCausalLM.from_pretrained(path)
    dataset = load("multilingual_thinking")
    train, test = _encode(tokenizer, dataset["train"]), _encode(tokenizer, dataset["test"][:32])

    eval_ids, eval_labels = _batch(test, tokenizer.pad_token_id)

    @torch.no_grad()
    def eval_loss():
        model.eval()
        loss = model(input_ids=eval_ids, labels=eval_labels).loss
        model.train()
        return loss.item()

    # Baseline: a unigram model of the assistant tokens, fitted on train. Beating it clearly means the
    # model learned structure (templates, the reasoning language, the answers), not token frequencies.
    counts = collections.Counter(t for _, labels in train for t in labels.tolist() if t != -100)
    total = sum(counts.values())
    test_tokens = [t for _, labels in test for t in labels.tolist() if t != -100]
    unigram = -sum(math.log((counts[t] + 1) / (total + len(tokenizer))) for t in test_tokens) / len(test_tokens)

    before = eval_loss()
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-3)
    order = torch.randperm(len(train))
    for step in range(30):
        input_ids, labels = _batch([train[i] for i in order[step * 8:(step + 1) * 8].tolist()], tokenizer.pad_token_id)
        model(input_ids=input_ids, labels=labels).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    after = eval_loss()
    print(f"eval loss {before:.2f} -> {after:.2f} (unigram baseline {unigram:.2f})")
    assert before > 7.0  # random init: about log(vocabulary)
    assert after < unigram - 1.0, f"eval loss {after:.2f} vs unigram {unigram:.2f}"
