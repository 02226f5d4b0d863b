"""Fine-tuning datasets: validate a JSONL file at upload, tokenize it for training.

Four formats, one per file, detected from the first line that names one:
  chat         {"messages": [{"role": "system"|"user"|"assistant", "content": str, "weight": 0|1}, ...]}
  instruction  {"prompt": str, "completion": str}
  text         {"text": str}
  preference   {"input": {"messages": [...]}, "preferred_output": [...], "non_preferred_output": [...]}
               (DPO's; preference_data.py checks and tokenizes it)
The first three train supervised jobs, the last DPO jobs (methods.py); an upload may be any of them.

Every line is checked (a bad line found hours into a job wastes the job), and
the report lists the first MAX_REPORTED_ERRORS problems with line numbers plus a
count per reason over the whole file. Examples are tokenized with the served
base's own tokenizer and chat template, so lengths and loss masks are exactly
what the trainer will see:
  chat         loss on the content + end-of-turn token of assistant messages with weight 1
  instruction  prompt encoded as /v1/completions encodes it; loss on completion + EOS
  text         loss on every token (+ EOS)
  preference   the served prompt, and each answer through its end-of-turn token (PreferenceExample)
"""
from __future__ import annotations

import codecs
import enum
import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from loraloom.engine import ChatTemplateError, Tokenizer
from loraloom.platform.json_input import JsonInputError, parse_json
from loraloom.platform.training.errors import TrainingInputError
from loraloom.platform.training.line_errors import InvalidLine as _InvalidLine
from loraloom.platform.training.line_errors import json_type as _json_type
from loraloom.platform.training.methods import SUPERVISED, check_file_method
from loraloom.platform.training.preference_data import (
    PreferenceExample,
    check_preference_record,
    encode_preference,
)

MAX_REPORTED_ERRORS = 20
TRAINING_ROLES = ("system", "user", "assistant")
MESSAGE_FIELDS = ("role", "content", "weight")


class DatasetFormat(str, enum.Enum):
    CHAT = "chat"
    INSTRUCTION = "instruction"
    TEXT = "text"
    PREFERENCE = "preference"


# The fields each format requires; they also identify a line's format.
FORMAT_FIELDS = {
    DatasetFormat.CHAT: ("messages",),
    DatasetFormat.INSTRUCTION: ("prompt", "completion"),
    DatasetFormat.TEXT: ("text",),
    DatasetFormat.PREFERENCE: ("input", "preferred_output", "non_preferred_output"),
}


@dataclass(frozen=True)
class LineError:
    line: int | None  # 1-based line number; None when the whole file is at fault (empty file)
    reason: str  # stable code, e.g. "invalid_json"; the report counts errors per reason
    message: str  # what is wrong and how to fix it
    param: str | None  # where inside the line, e.g. "messages[2].role"


@dataclass(frozen=True)
class TokenizedExample:
    line: int
    input_ids: tuple[int, ...]  # [seq_len]
    loss_mask: tuple[bool, ...]  # [seq_len] True where the token is a training target

    @property
    def num_trained_tokens(self) -> int:
        return sum(self.loss_mask)

    @property
    def token_count(self) -> int:
        """Tokens through the model per training pass (what trained_tokens counts)."""
        return len(self.input_ids)

    @property
    def longest_sequence(self) -> int:
        return len(self.input_ids)


Example = TokenizedExample | PreferenceExample


@dataclass(frozen=True)
class DatasetReport:
    format: DatasetFormat | None  # None when no line names a format
    num_lines: int  # examples in the file: its non-blank lines
    num_tokens: int  # over the valid examples
    num_trained_tokens: int  # tokens the loss is computed on
    errors: tuple[LineError, ...]  # the first MAX_REPORTED_ERRORS, in line order
    error_counts: dict[str, int]  # reason -> number of lines, over the whole file

    @property
    def ok(self) -> bool:
        return not self.error_counts

    @property
    def num_errors(self) -> int:
        return sum(self.error_counts.values())


class DatasetValidationError(TrainingInputError):
    """A dataset with invalid lines; `report` has them all."""

    def __init__(self, report: DatasetReport, param: str) -> None:
        listed = "; ".join(
            f"line {error.line}: {error.message}" if error.line is not None else error.message
            for error in report.errors[:3]
        )
        more = f" (and {report.num_errors - 3} more)" if report.num_errors > 3 else ""
        super().__init__(
            code="invalid_training_file",
            message=f"{param}: {report.num_errors} invalid line(s): {listed}{more}",
            param=param,
        )
        self.report = report


def validate_dataset(source: bytes | Path, tokenizer: Tokenizer, max_seq_len: int) -> DatasetReport:
    """Check every line of a JSONL dataset; the report says whether it is usable and why not."""
    report, _ = _scan(_read(source), tokenizer, max_seq_len, keep_examples=False)
    return report


def read_dataset(
    source: bytes | Path, tokenizer: Tokenizer, max_seq_len: int, *, param: str
) -> tuple[DatasetReport, list[Example]]:
    """The tokenized examples of a valid dataset in any format (an upload); raise DatasetValidationError
    (naming `param`, the request field the file came from) if any line is invalid."""
    report, examples = _scan(_read(source), tokenizer, max_seq_len, keep_examples=True)
    if not report.ok:
        raise DatasetValidationError(report, param)
    return report, examples


def load_dataset(
    source: bytes | Path, tokenizer: Tokenizer, max_seq_len: int, *, param: str, method: str = SUPERVISED
) -> tuple[DatasetReport, list[Example]]:
    """A job's examples: TokenizedExample for a supervised job, PreferenceExample for a DPO one. Raise
    DatasetValidationError for invalid lines, and TrainingInputError naming `param` for a file whose
    format is not the one `method` trains on."""
    report, examples = read_dataset(source, tokenizer, max_seq_len, param=param)
    assert report.format is not None, "a valid dataset has a format"
    check_file_method(report.format, method, param)
    return report, examples


def _read(source: bytes | Path) -> bytes:
    return source.read_bytes() if isinstance(source, Path) else source


def _scan(
    data: bytes, tokenizer: Tokenizer, max_seq_len: int, keep_examples: bool
) -> tuple[DatasetReport, list[Example]]:
    encoder = _ExampleEncoder(tokenizer)
    errors: list[LineError] = []
    counts: Counter[str] = Counter()
    examples: list[Example] = []
    file_format: DatasetFormat | None = None
    format_line = 0
    num_lines = num_tokens = num_trained_tokens = 0
    if data.startswith(codecs.BOM_UTF8):  # editors on Windows write one; it is not part of line 1's JSON
        data = data[len(codecs.BOM_UTF8):]
    for line_number, raw in enumerate(data.split(b"\n"), start=1):
        if not raw.strip():
            continue  # blank lines (a trailing newline, spacing) carry no example
        num_lines += 1
        try:
            record = _parse_object(raw)
            line_format = _detect_format(record)
            if file_format is None:
                file_format, format_line = line_format, line_number
            elif line_format is not file_format:
                raise _InvalidLine(
                    "mixed_formats",
                    f"this line is in {line_format.value} format but the file is in {file_format.value} format "
                    f"(set by line {format_line}); use one format per file",
                )
            _check_fields(record, line_format)
            example = encoder.encode(line_format, record, line_number)
            if example.longest_sequence > max_seq_len:
                raise _InvalidLine(
                    "too_long",
                    f"the example is {example.longest_sequence} tokens long, above max_seq_len {max_seq_len}; "
                    "shorten or split it",
                )
        except _InvalidLine as invalid:
            counts[invalid.reason] += 1
            if len(errors) < MAX_REPORTED_ERRORS:
                errors.append(LineError(line_number, invalid.reason, invalid.message, invalid.param))
            continue
        num_tokens += example.token_count
        num_trained_tokens += example.num_trained_tokens
        if keep_examples:
            examples.append(example)
    if num_lines == 0:
        counts["empty_file"] += 1
        errors.append(LineError(None, "empty_file", "the file holds no examples; add one JSON object per line", None))
    report = DatasetReport(
        format=file_format,
        num_lines=num_lines,
        num_tokens=num_tokens,
        num_trained_tokens=num_trained_tokens,
        errors=tuple(errors),
        error_counts=dict(counts),
    )
    return report, examples


# --- one line's structure --------------------------------------------------------------


def _parse_object(raw: bytes) -> dict:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise _InvalidLine(
            "invalid_utf8",
            f"not valid UTF-8 (byte 0x{raw[error.start]:02x} at column {error.start + 1}); save the file as UTF-8",
        ) from error
    try:
        record = parse_json(text, "the line")
    except json.JSONDecodeError as error:
        raise _InvalidLine("invalid_json", f"not valid JSON: {error.msg} at column {error.colno}") from error
    except JsonInputError as error:  # nested too deep, or a lone surrogate the tokenizer cannot encode
        raise _InvalidLine("invalid_json", str(error), error.path) from error
    if not isinstance(record, dict):
        raise _InvalidLine(
            "not_an_object", f"the line is a JSON {_json_type(record)}; each line must be one JSON object"
        )
    return record


def _detect_format(record: dict) -> DatasetFormat:
    matches = [fmt for fmt, fields in FORMAT_FIELDS.items() if any(field in record for field in fields)]
    if not matches:
        raise _InvalidLine(
            "unknown_format",
            f"the object has fields {sorted(record)}; expected 'messages' (chat), 'prompt' and 'completion' "
            "(instruction), 'text' (text) or 'input', 'preferred_output' and 'non_preferred_output' (preference)",
        )
    if len(matches) > 1:
        raise _InvalidLine(
            "ambiguous_format",
            f"the object has fields of several formats ({', '.join(fmt.value for fmt in matches)}); use one",
        )
    return matches[0]


def _check_fields(record: dict, line_format: DatasetFormat) -> None:
    for field in FORMAT_FIELDS[line_format]:
        if field not in record:
            raise _InvalidLine("missing_field", f"{line_format.value} format needs the field {field!r}", field)
    for field in record:
        if field not in FORMAT_FIELDS[line_format]:
            raise _InvalidLine(
                "unexpected_field",
                f"unexpected field {field!r}; {line_format.value} format has only "
                f"{', '.join(FORMAT_FIELDS[line_format])}",
                field,
            )
    if line_format is DatasetFormat.CHAT:
        _check_messages(record["messages"])
    elif line_format is DatasetFormat.PREFERENCE:
        check_preference_record(record)
    else:
        for field in FORMAT_FIELDS[line_format]:
            _check_content(record[field], field)


def _check_content(value: object, param: str) -> None:
    if not isinstance(value, str):
        raise _InvalidLine("invalid_type", f"{param} must be a string, got a JSON {_json_type(value)}", param)
    if not value.strip():
        raise _InvalidLine("empty_content", f"{param} is empty", param)


def _check_messages(messages: object) -> None:
    if not isinstance(messages, list):
        raise _InvalidLine(
            "invalid_type", f"messages must be a list of messages, got a JSON {_json_type(messages)}", "messages"
        )
    for index, message in enumerate(messages):
        _check_message(message, f"messages[{index}]")
    # Roles: an optional system message, then user and assistant taking turns, ending with the assistant.
    roles = [message["role"] for message in messages]
    if "assistant" not in roles:
        raise _InvalidLine(
            "no_assistant_message", "the conversation has no assistant message; there is nothing to learn",
            "messages",
        )
    first_turn = 1 if roles[0] == "system" else 0
    for index in range(first_turn, len(roles)):
        expected = "user" if (index - first_turn) % 2 == 0 else "assistant"
        if roles[index] != expected:
            where = "only as the first message" if roles[index] == "system" else "after the previous message"
            raise _InvalidLine(
                "roles_not_alternating",
                f"messages[{index}] has role {roles[index]!r} but {expected!r} is expected {where}; after an "
                "optional system message, user and assistant messages must alternate, starting with user",
                f"messages[{index}].role",
            )
    if roles[-1] != "assistant":
        raise _InvalidLine(
            "roles_not_alternating",
            "the last message must be an assistant message (messages after it teach nothing)",
            f"messages[{len(roles) - 1}].role",
        )
    if all(message.get("weight", 1) == 0 for message in messages if message["role"] == "assistant"):
        raise _InvalidLine(
            "no_trained_tokens", "every assistant message has weight 0; give at least one weight 1", "messages"
        )


def _check_message(message: object, param: str) -> None:
    if not isinstance(message, dict):
        raise _InvalidLine("invalid_type", f"{param} must be an object, got a JSON {_json_type(message)}", param)
    for field in message:
        if field not in MESSAGE_FIELDS:
            raise _InvalidLine(
                "unexpected_field",
                f"unexpected field {field!r} in {param}; a message has {', '.join(MESSAGE_FIELDS)}",
                f"{param}.{field}",
            )
    for field in ("role", "content"):
        if field not in message:
            raise _InvalidLine("missing_field", f"{param} needs the field {field!r}", f"{param}.{field}")
    role = message["role"]
    if role not in TRAINING_ROLES:
        raise _InvalidLine(
            "invalid_role", f"{param}.role is {role!r}; use one of {', '.join(TRAINING_ROLES)}", f"{param}.role"
        )
    _check_content(message["content"], f"{param}.content")
    if "weight" in message:
        weight = message["weight"]
        if role != "assistant":
            raise _InvalidLine(
                "invalid_weight", f"{param} is a {role} message; weight is allowed on assistant messages only",
                f"{param}.weight",
            )
        # bool is an int in Python, but JSON true/false is not a weight.
        if type(weight) is not int or weight not in (0, 1):
            raise _InvalidLine(
                "invalid_weight", f"{param}.weight is {json.dumps(weight)}; it must be 0 or 1", f"{param}.weight"
            )


# --- tokens and loss masks ---------------------------------------------------------------


class _ExampleEncoder:
    """Turns a checked record into token ids and a loss mask, with the base's tokenizer."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        eos_id = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else next(
            iter(tokenizer.eos_token_ids), None
        )
        if eos_id is None:
            raise RuntimeError(
                "training: the base model declares no end-of-sequence token, so examples cannot teach it to stop"
            )
        self.eos_text = tokenizer.id_to_token(eos_id)
        # Any of these ends an assistant turn in a chat template (e.g. <|im_end|>, <|eot_id|>).
        self.end_of_turn_texts = [tokenizer.id_to_token(token_id) for token_id in tokenizer.eos_token_ids]

    def encode(self, line_format: DatasetFormat, record: dict, line: int) -> Example:
        if line_format is DatasetFormat.PREFERENCE:
            return encode_preference(self, record, line)
        if line_format is DatasetFormat.CHAT:
            segments, add_special_tokens = self._chat_segments(record["messages"]), False  # the template has BOS
        elif line_format is DatasetFormat.INSTRUCTION:
            segments = [(record["prompt"], False), (record["completion"] + self.eos_text, True)]
            add_special_tokens = True  # as /v1/completions encodes a prompt
        else:
            segments, add_special_tokens = [(record["text"] + self.eos_text, True)], True
        input_ids: list[int] = []
        loss_mask: list[bool] = []
        # Each segment is encoded on its own so the trained tokens are exactly the trained text; the
        # untrained part before an answer is thereby encoded exactly as the serving prompt is.
        for index, (text, trained) in enumerate(segments):
            ids = self.tokenizer.encode(text, add_special_tokens=add_special_tokens and index == 0)
            input_ids.extend(ids)
            loss_mask.extend([trained] * len(ids))
        loss_mask[0] = False  # nothing predicts the first token
        return TokenizedExample(line=line, input_ids=tuple(input_ids), loss_mask=tuple(loss_mask))

    def render(self, messages: list[dict], add_generation_prompt: bool, tools: list[dict] | None = None) -> str:
        try:
            return self.tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt,
                                                      tools=tools)
        except ChatTemplateError as error:
            raise _InvalidLine("chat_template_error", str(error), "messages") from error

    def _chat_segments(self, messages: list[dict]) -> list[tuple[str, bool]]:
        """The rendered conversation cut into (text, trained) pieces.

        An answer's span is found by rendering the conversation up to it twice: with the
        generation prompt (what the model is served) and with the answer (what it must say).
        """
        plain = [{"role": message["role"], "content": message["content"]} for message in messages]
        full = self.render(plain, add_generation_prompt=False)
        segments: list[tuple[str, bool]] = []
        cursor = 0
        for index, message in enumerate(messages):
            if message["role"] != "assistant" or message.get("weight", 1) == 0:
                continue
            prompt = self.render(plain[:index], add_generation_prompt=True)
            turn = self.render(plain[:index + 1], add_generation_prompt=False)
            if not (turn.startswith(prompt) and full.startswith(turn)):
                raise RuntimeError(
                    "training: the base model's chat template does not render a conversation as a prefix of its "
                    "continuation, so assistant tokens cannot be located for the loss mask"
                )
            start, end = self.answer_span(turn, len(prompt), message["content"])
            segments += [(full[cursor:start], False), (full[start:end], True)]
            cursor = end
        segments.append((full[cursor:], False))
        return [(text, trained) for text, trained in segments if text]

    def answer_span(self, turn: str, answer_start: int, content: str) -> tuple[int, int]:
        """[start, end) of the content and the end-of-turn token that follows it in `turn`."""
        start = turn.find(content, answer_start)
        length = len(content)
        if start < 0:  # some templates trim message content
            start, length = turn.find(content.strip(), answer_start), len(content.strip())
        if start < 0:
            raise RuntimeError("training: the base model's chat template changes assistant content when rendering "
                               "it, so assistant tokens cannot be located for the loss mask")
        content_end = start + length
        ends = [
            (position, len(text))
            for text in self.end_of_turn_texts
            if (position := turn.find(text, content_end)) >= 0
        ]
        if not ends:
            raise RuntimeError("training: the base model's chat template ends assistant turns without an "
                               "end-of-sequence token, so the model could not learn to stop")
        end_of_turn, end_of_turn_length = min(ends)
        return start, end_of_turn + end_of_turn_length
