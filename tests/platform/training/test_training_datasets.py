"""Dataset validation and tokenization against Hugging Face's tokenizer for the bundled model."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from loraloom.engine.tokenizer import Tokenizer
from loraloom.platform.training.datasets import (
    MAX_REPORTED_ERRORS,
    DatasetFormat,
    DatasetValidationError,
    TokenizedExample,
    load_dataset,
    validate_dataset,
)

MAX_SEQ_LEN = 256
EOS_TEXT = "<|im_end|>"  # SmolLM2's end-of-sequence / end-of-turn token


@pytest.fixture(scope="module")
def tokenizer(model_dir: Path) -> Tokenizer:
    return Tokenizer.from_dir(model_dir)


@pytest.fixture(scope="module")
def hf_tokenizer(model_dir: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


def chat(*turns: tuple[str, str], **extra) -> dict:
    return {"messages": [{"role": role, "content": content} for role, content in turns], **extra}


def jsonl(*records: object) -> bytes:
    return "\n".join(json.dumps(record) for record in records).encode()


GOOD_CHAT = chat(("user", "What is 2+2?"), ("assistant", "4"))
GOOD_INSTRUCTION = {"prompt": "Translate 'cat' to French:", "completion": " chat"}
GOOD_TEXT = {"text": "The quick brown fox."}


def lines(*parts: bytes | dict) -> bytes:
    """A file whose lines are given raw (bytes) or as JSON objects."""
    return b"\n".join(part if isinstance(part, bytes) else json.dumps(part).encode() for part in parts)


# (file, line, reason, param): the first invalid line of each file.
MALFORMED = {
    "not_utf8": (lines(GOOD_TEXT, b'{"text": "caf\xe9"}'), 2, "invalid_utf8", None),
    "not_json": (lines(GOOD_TEXT, GOOD_TEXT, b'{"text": "a"'), 3, "invalid_json", None),
    "array_line": (lines(GOOD_TEXT, b'["text", "a"]'), 2, "not_an_object", None),
    "string_line": (lines(b'"just text"', GOOD_TEXT), 1, "not_an_object", None),
    "unknown_format": (lines(GOOD_TEXT, {"question": "a", "answer": "b"}), 2, "unknown_format", None),
    "two_formats_in_one_line": (lines({"text": "a", "prompt": "b", "completion": "c"}), 1, "ambiguous_format", None),
    "mixed_formats": (lines(GOOD_CHAT, GOOD_CHAT, GOOD_INSTRUCTION), 3, "mixed_formats", None),
    "missing_completion": (lines(GOOD_INSTRUCTION, {"prompt": "a"}), 2, "missing_field", "completion"),
    "unexpected_field": (lines(GOOD_TEXT, {"text": "a", "id": 3}), 2, "unexpected_field", "id"),
    "text_not_string": (lines(GOOD_TEXT, {"text": 5}), 2, "invalid_type", "text"),
    "messages_not_list": (lines(GOOD_CHAT, {"messages": "hi"}), 2, "invalid_type", "messages"),
    "message_not_object": (lines(GOOD_CHAT, {"messages": ["hi"]}), 2, "invalid_type", "messages[0]"),
    "message_without_content": (
        lines(GOOD_CHAT, {"messages": [{"role": "user"}]}), 2, "missing_field", "messages[0].content"
    ),
    "bad_role": (lines(GOOD_CHAT, chat(("user", "a"), ("bot", "b"))), 2, "invalid_role", "messages[1].role"),
    "tool_role": (lines(chat(("user", "a"), ("tool", "b"))), 1, "invalid_role", "messages[1].role"),
    "no_assistant_turn": (lines(GOOD_CHAT, chat(("system", "s"), ("user", "a"))), 2, "no_assistant_message",
                          "messages"),
    "empty_messages": (lines(GOOD_CHAT, {"messages": []}), 2, "no_assistant_message", "messages"),
    "two_user_turns": (
        lines(GOOD_CHAT, chat(("user", "a"), ("user", "b"), ("assistant", "c"))), 2, "roles_not_alternating",
        "messages[1].role",
    ),
    "assistant_first": (lines(chat(("assistant", "a"), ("user", "b"), ("assistant", "c"))), 1,
                        "roles_not_alternating", "messages[0].role"),
    "late_system": (
        lines(chat(("user", "a"), ("system", "s"), ("assistant", "c"))), 1, "roles_not_alternating",
        "messages[1].role",
    ),
    "ends_with_user": (
        lines(GOOD_CHAT, chat(("user", "a"), ("assistant", "b"), ("user", "c"))), 2, "roles_not_alternating",
        "messages[2].role",
    ),
    "empty_assistant_content": (
        lines(GOOD_CHAT, chat(("user", "a"), ("assistant", "  \n"))), 2, "empty_content", "messages[1].content"
    ),
    "empty_prompt": (lines(GOOD_INSTRUCTION, {"prompt": "", "completion": "x"}), 2, "empty_content", "prompt"),
    "weight_two": (
        lines(GOOD_CHAT, {"messages": [{"role": "user", "content": "a"},
                                       {"role": "assistant", "content": "b", "weight": 2}]}),
        2, "invalid_weight", "messages[1].weight",
    ),
    "weight_true": (
        lines({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b", "weight": True}]}),
        1, "invalid_weight", "messages[1].weight",
    ),
    "weight_on_user": (
        lines({"messages": [{"role": "user", "content": "a", "weight": 1}, {"role": "assistant", "content": "b"}]}),
        1, "invalid_weight", "messages[0].weight",
    ),
    "all_weights_zero": (
        lines(GOOD_CHAT, {"messages": [{"role": "user", "content": "a"},
                                       {"role": "assistant", "content": "b", "weight": 0}]}),
        2, "no_trained_tokens", "messages",
    ),
    "message_typo_field": (
        lines({"messages": [{"role": "user", "contnet": "a"}, {"role": "assistant", "content": "b"}]}),
        1, "unexpected_field", "messages[0].contnet",
    ),
    "too_long": (lines(GOOD_TEXT, {"text": "word " * 400}), 2, "too_long", None),
    "blank_lines_count": (lines(GOOD_TEXT, b"", b"   ", b"{oops}"), 4, "invalid_json", None),
    # Issue 12 item 10: lines that were a 500 (RecursionError; the tokenizer refusing a lone surrogate).
    "nested_too_deep": (lines(GOOD_TEXT, b'{"text": "a", "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"), 2,
                        "invalid_json", None),
    "nested_too_deep_in_messages": (lines(b'{"messages": ' + b"[" * 5_000 + b"]" * 5_000 + b"}"), 1,
                                    "invalid_json", None),
    "lone_surrogate_in_content": (
        lines(GOOD_CHAT, b'{"messages": [{"role": "user", "content": "a\\ud800"}, {"role": "assistant", "content": "b"}]}'),
        2, "invalid_json", "messages[0].content",
    ),
    "lone_low_surrogate_in_text": (lines(b'{"text": "\\udfff x"}'), 1, "invalid_json", "text"),
    "reversed_surrogate_pair": (lines(b'{"prompt": "a", "completion": "\\ude00\\ud83d"}'), 1, "invalid_json",
                                "completion"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_file_is_rejected_with_line_and_reason(case: str, tokenizer: Tokenizer) -> None:
    data, line, reason, param = MALFORMED[case]
    report = validate_dataset(data, tokenizer, MAX_SEQ_LEN)
    assert not report.ok
    assert report.num_errors == 1, report.errors
    error = report.errors[0]
    assert (error.line, error.reason, error.param) == (line, reason, param)
    assert report.error_counts == {reason: 1}
    assert error.message


def test_a_surrogate_pair_is_text_not_a_lone_surrogate(tokenizer: Tokenizer) -> None:
    """The escaped form of an emoji (what json.dumps writes by default) is valid, unlike a lone half."""
    report = validate_dataset(jsonl({"text": "smile \U0001F600"}), tokenizer, MAX_SEQ_LEN)
    assert report.ok, report.errors


def test_empty_file_is_rejected(tokenizer: Tokenizer) -> None:
    for data in (b"", b"\n\n  \n"):
        report = validate_dataset(data, tokenizer, MAX_SEQ_LEN)
        assert [(e.line, e.reason) for e in report.errors] == [(None, "empty_file")]
        assert report.num_lines == 0


def test_messages_name_the_problem(tokenizer: Tokenizer) -> None:
    messages = {case: validate_dataset(MALFORMED[case][0], tokenizer, MAX_SEQ_LEN).errors[0].message
                for case in ("not_utf8", "mixed_formats", "bad_role", "weight_two", "too_long")}
    assert "0xe9" in messages["not_utf8"]
    assert "instruction" in messages["mixed_formats"] and "set by line 1" in messages["mixed_formats"]
    assert "'bot'" in messages["bad_role"] and "assistant" in messages["bad_role"]
    assert "must be 0 or 1" in messages["weight_two"]
    assert f"max_seq_len {MAX_SEQ_LEN}" in messages["too_long"]


def test_report_lists_first_errors_and_counts_all(tokenizer: Tokenizer) -> None:
    bad = [b"not json"] * 25 + [json.dumps({"text": 1}).encode()] * 3
    data = lines(GOOD_TEXT, *bad, GOOD_TEXT)
    report = validate_dataset(data, tokenizer, MAX_SEQ_LEN)
    assert len(report.errors) == MAX_REPORTED_ERRORS
    assert [error.line for error in report.errors] == list(range(2, 2 + MAX_REPORTED_ERRORS))
    assert report.error_counts == {"invalid_json": 25, "invalid_type": 3}
    assert report.num_errors == 28
    assert report.num_lines == 30


def test_load_dataset_raises_with_the_report(tokenizer: Tokenizer) -> None:
    data, *_ = MALFORMED["bad_role"]
    with pytest.raises(DatasetValidationError) as caught:
        load_dataset(data, tokenizer, MAX_SEQ_LEN, param="validation_file")
    assert caught.value.param == "validation_file"
    assert caught.value.code == "invalid_training_file"
    assert "line 2" in caught.value.message
    assert caught.value.report.error_counts == {"invalid_role": 1}


def masked_text(hf_tokenizer, example: TokenizedExample) -> str:
    trained = [token for token, mask in zip(example.input_ids, example.loss_mask) if mask]
    return hf_tokenizer.decode(trained, skip_special_tokens=False)


def test_chat_tokens_and_loss_mask(tokenizer: Tokenizer, hf_tokenizer, tmp_path: Path) -> None:
    conversations = [
        chat(("user", "What is the capital of France?"), ("assistant", "Paris.")),
        chat(("system", "Answer in one word."), ("user", "Color of the sky?"), ("assistant", "Blue")),
        {"messages": [
            {"role": "user", "content": "Count to two."},
            {"role": "assistant", "content": "One, two.", "weight": 0},
            {"role": "user", "content": "Now to three, with a smile 🙂"},
            {"role": "assistant", "content": "One, two, three 🙂", "weight": 1},
            {"role": "user", "content": "And back?"},
            {"role": "assistant", "content": "Three, two, one."},
        ]},
    ]
    path = tmp_path / "chat.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + jsonl(*conversations).replace(b"\n", b"\r\n") + b"\r\n")  # BOM, CRLF
    report, examples = load_dataset(path, tokenizer, MAX_SEQ_LEN, param="training_file")
    expected_ids = [
        hf_tokenizer.apply_chat_template(
            [{"role": m["role"], "content": m["content"]} for m in c["messages"]], tokenize=True, return_dict=False
        )
        for c in conversations
    ]
    assert [list(example.input_ids) for example in examples] == expected_ids
    assert [example.line for example in examples] == [1, 2, 3]
    expected_trained = [
        "".join(m["content"] + EOS_TEXT for m in c["messages"] if m["role"] == "assistant" and m.get("weight", 1))
        for c in conversations
    ]
    assert [masked_text(hf_tokenizer, example) for example in examples] == expected_trained
    assert report.format is DatasetFormat.CHAT
    assert report.ok and report.num_lines == 3
    assert report.num_tokens == sum(map(len, expected_ids))
    assert report.num_trained_tokens == sum(example.num_trained_tokens for example in examples)
    assert validate_dataset(path, tokenizer, MAX_SEQ_LEN) == report


def test_instruction_tokens_and_loss_mask(tokenizer: Tokenizer, hf_tokenizer) -> None:
    records = [GOOD_INSTRUCTION, {"prompt": "Q: 7*6?\nA:", "completion": " 42"}]
    report, examples = load_dataset(jsonl(*records), tokenizer, MAX_SEQ_LEN, param="training_file")
    for record, example in zip(records, examples):
        prompt_ids = hf_tokenizer(record["prompt"], add_special_tokens=True)["input_ids"]
        completion_ids = hf_tokenizer(record["completion"], add_special_tokens=False)["input_ids"]
        assert list(example.input_ids) == prompt_ids + completion_ids + [hf_tokenizer.eos_token_id]
        assert masked_text(hf_tokenizer, example) == record["completion"] + EOS_TEXT
        assert not any(example.loss_mask[:len(prompt_ids)])
    assert report.format is DatasetFormat.INSTRUCTION
    assert (report.num_lines, report.num_tokens) == (2, sum(len(example.input_ids) for example in examples))


def test_text_tokens_and_loss_mask(tokenizer: Tokenizer, hf_tokenizer) -> None:
    records = [GOOD_TEXT, {"text": "Zwei Zeilen\nmit Umlauten: äöü."}]
    report, examples = load_dataset(jsonl(*records) + b"\n", tokenizer, MAX_SEQ_LEN, param="training_file")
    for record, example in zip(records, examples):
        expected = hf_tokenizer(record["text"], add_special_tokens=True)["input_ids"] + [hf_tokenizer.eos_token_id]
        assert list(example.input_ids) == expected
        # Every token is a target except the first, which nothing predicts.
        assert example.loss_mask == (False,) + (True,) * (len(expected) - 1)
        assert hf_tokenizer.decode(list(example.input_ids), skip_special_tokens=False) == record["text"] + EOS_TEXT
    assert report.format is DatasetFormat.TEXT
    assert (report.num_lines, report.num_tokens, report.num_trained_tokens) == (
        2, sum(len(e.input_ids) for e in examples), sum(len(e.input_ids) - 1 for e in examples)
    )


def test_max_seq_len_boundary(tokenizer: Tokenizer) -> None:
    _, [example] = load_dataset(jsonl(GOOD_TEXT), tokenizer, MAX_SEQ_LEN, param="training_file")
    length = len(example.input_ids)
    assert validate_dataset(jsonl(GOOD_TEXT), tokenizer, length).ok
    assert validate_dataset(jsonl(GOOD_TEXT), tokenizer, length - 1).error_counts == {"too_long": 1}
