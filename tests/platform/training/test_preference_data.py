"""DPO's preference format (OpenAI's): checked line by line at upload with the field at fault,
tokenized as the chat route serves the prompt, and refused by a job of the other method."""
from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from live_api import new_tenant
from training_live import training_settings

from loraloom.engine.tokenizer import Tokenizer
from loraloom.platform.db import create_db_engine, create_session_factory
from loraloom.platform.storage import storage_from_settings
from loraloom.platform.training.datasets import DatasetFormat, DatasetValidationError, load_dataset, validate_dataset
from loraloom.platform.training.errors import TrainingInputError
from loraloom.platform.training.files import FINE_TUNE_PURPOSE, create_file
from loraloom.platform.training.methods import check_file_method
from loraloom.platform.training.preference_data import PreferenceExample

MAX_SEQ_LEN = 256
END_OF_TURN = "<|im_end|>"  # SmolLM2's


@pytest.fixture(scope="module")
def tokenizer(model_dir: Path) -> Tokenizer:
    return Tokenizer.from_dir(model_dir)


def pair(question: str = "What is 2+2?", preferred: str = "4.", rejected: str = "5.", **input_extra) -> dict:
    return {
        "input": {"messages": [{"role": "user", "content": question}], **input_extra},
        "preferred_output": [{"role": "assistant", "content": preferred}],
        "non_preferred_output": [{"role": "assistant", "content": rejected}],
    }


def jsonl(*records: object) -> bytes:
    return "\n".join(json.dumps(record) for record in records).encode()


def with_input(**changes) -> dict:
    record = pair()
    record["input"] = {**record["input"], **changes}
    return record


def without(field: str) -> dict:
    record = pair()
    del record[field]
    return record


GOOD = pair()
# (second line, reason, param): each file's line 1 is good, line 2 is not.
MALFORMED = {
    "missing_non_preferred": (without("non_preferred_output"), "missing_field", "non_preferred_output"),
    "extra_field": ({**pair(), "score": 1}, "unexpected_field", "score"),
    "input_not_object": ({**pair(), "input": "hi"}, "invalid_type", "input"),
    "input_extra_field": (with_input(temperature=1), "unexpected_field", "input.temperature"),
    "no_messages": ({**pair(), "input": {}}, "missing_field", "input.messages"),
    "empty_messages": (with_input(messages=[]), "invalid_type", "input.messages"),
    "bad_role": (with_input(messages=[{"role": "robot", "content": "x"}]), "invalid_role", "input.messages[0].role"),
    "content_not_string": (with_input(messages=[{"role": "user", "content": 3}]), "invalid_type",
                           "input.messages[0].content"),
    "ends_with_assistant": (with_input(messages=[{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]),
                            "roles_not_alternating", "input.messages[1].role"),
    "tools_not_list": (with_input(tools={"type": "function"}), "invalid_type", "input.tools"),
    "parallel_not_bool": (with_input(parallel_tool_calls="yes"), "invalid_type", "input.parallel_tool_calls"),
    "two_preferred": ({**pair(), "preferred_output": [{"role": "assistant", "content": "a"}] * 2}, "invalid_type",
                      "preferred_output"),
    "preferred_by_user": ({**pair(), "preferred_output": [{"role": "user", "content": "a"}]}, "invalid_role",
                          "preferred_output[0].role"),
    "empty_rejected": (pair(rejected=" "), "empty_content", "non_preferred_output[0].content"),
    "identical": (pair(preferred="4.", rejected="4."), "identical_outputs", "non_preferred_output"),
    # The bundled template does not show tools: a prompt the server never sends is refused.
    "tools_not_rendered": (with_input(tools=[{"type": "function", "function": {"name": "f"}}]), "tools_not_rendered",
                           "input.tools"),
    "mixed_with_chat": ({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]},
                        "mixed_formats", None),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_preference_lines_name_line_and_field(case: str, tokenizer: Tokenizer) -> None:
    line, reason, param = MALFORMED[case]
    report = validate_dataset(jsonl(GOOD, line), tokenizer, MAX_SEQ_LEN)
    assert report.format is DatasetFormat.PREFERENCE
    assert [(error.line, error.reason, error.param) for error in report.errors] == [(2, reason, param)]


def test_preference_tokens_are_the_served_prompt_and_each_answer_through_its_end_of_turn(tokenizer: Tokenizer) -> None:
    system = {"role": "system", "content": "Be brief."}
    record = pair("Capital of France?", "Paris.", "I am not sure, maybe Lyon.", parallel_tool_calls=False)
    record["input"]["messages"].insert(0, system)
    report, [example] = load_dataset(jsonl(record), tokenizer, MAX_SEQ_LEN, param="training_file", method="dpo")
    assert isinstance(example, PreferenceExample) and example.line == 1
    messages = [system, {"role": "user", "content": "Capital of France?"}]
    assert list(example.prompt_ids) == tokenizer.encode_chat(messages)  # exactly what the chat route sends
    assert tokenizer.decode(list(example.chosen_ids), skip_special_tokens=False) == f"Paris.{END_OF_TURN}"
    assert tokenizer.decode(list(example.rejected_ids), skip_special_tokens=False) == (
        f"I am not sure, maybe Lyon.{END_OF_TURN}")
    # Prompt + answer is the template's rendering of the whole conversation, token for token.
    full = tokenizer.encode_chat(messages + [{"role": "assistant", "content": "Paris."}], add_generation_prompt=False)
    assert list(example.prompt_ids + example.chosen_ids) == full[:len(example.prompt_ids) + len(example.chosen_ids)]
    assert example.token_count == 2 * len(example.prompt_ids) + len(example.chosen_ids) + len(example.rejected_ids)
    assert (report.format, report.num_lines, report.num_tokens, report.num_trained_tokens) == (
        DatasetFormat.PREFERENCE, 1, example.token_count, len(example.chosen_ids) + len(example.rejected_ids))


def test_max_seq_len_bounds_the_longer_answer(tokenizer: Tokenizer) -> None:
    record = pair(rejected="no " * 40)
    [example] = load_dataset(jsonl(record), tokenizer, MAX_SEQ_LEN, param="training_file", method="dpo")[1]
    report = validate_dataset(jsonl(record), tokenizer, example.longest_sequence - 1)
    assert [(error.line, error.reason) for error in report.errors] == [(1, "too_long")]
    assert validate_dataset(jsonl(record), tokenizer, example.longest_sequence).ok


def test_a_file_in_the_other_methods_format_names_the_param_and_the_format(tokenizer: Tokenizer) -> None:
    chat = {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}
    with pytest.raises(TrainingInputError) as caught:
        load_dataset(jsonl(chat), tokenizer, MAX_SEQ_LEN, param="validation_file", method="dpo")
    assert (caught.value.param, caught.value.code) == ("validation_file", "invalid_file_format")
    assert "chat format" in caught.value.message and "preference format" in caught.value.message
    with pytest.raises(TrainingInputError) as caught:
        load_dataset(jsonl(GOOD), tokenizer, MAX_SEQ_LEN, param="training_file")  # supervised, the default
    assert (caught.value.param, caught.value.code) == ("training_file", "invalid_file_format")
    assert "preference format" in caught.value.message and "dpo" in caught.value.message
    # Invalid lines are reported as such, whatever the method.
    with pytest.raises(DatasetValidationError):
        load_dataset(jsonl(GOOD, without("input")), tokenizer, MAX_SEQ_LEN, param="training_file", method="dpo")
    # The create-time check, on a file's stored format.
    check_file_method("preference", "dpo", "training_file")
    check_file_method(DatasetFormat.TEXT, "supervised", "training_file")
    with pytest.raises(TrainingInputError) as caught:
        check_file_method("instruction", "dpo", "training_file")
    assert caught.value.param == "training_file"
    with pytest.raises(TrainingInputError) as caught:
        check_file_method("chat", "rlhf", "training_file")
    assert (caught.value.param, caught.value.code) == ("method.type", "invalid_method")


def test_an_upload_accepts_a_preference_file(model_dir: Path, tokenizer: Tokenizer, tmp_path: Path) -> None:
    settings = training_settings(tmp_path / "data")
    data = jsonl(GOOD, pair("Colour of the sky?", "Blue.", "Green, always."))
    examples = load_dataset(data, tokenizer, MAX_SEQ_LEN, param="file", method="dpo")[1]
    engine = create_db_engine(settings.database_url)
    try:
        with create_session_factory(engine)() as session:
            row = create_file(session, store=storage_from_settings(settings), tenant_id=new_tenant(session).id,
                              actor_key_id=None, filename="pairs.jsonl", purpose=FINE_TUNE_PURPOSE,
                              stream=io.BytesIO(data), max_bytes=settings.training_file_max_bytes,
                              tokenizer=tokenizer, max_seq_len=MAX_SEQ_LEN)
            assert (row.format, row.line_count) == ("preference", 2)
            assert row.token_count == sum(example.token_count for example in examples)
            assert row.max_example_tokens == max(example.longest_sequence for example in examples)
    finally:
        engine.dispose()
