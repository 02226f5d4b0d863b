"""The preference format of DPO fine-tuning (OpenAI's), one JSON object per line:

  {"input": {"messages": [...], "tools": [...], "parallel_tool_calls": bool},
   "preferred_output": [{"role": "assistant", "content": str}],
   "non_preferred_output": [{"role": "assistant", "content": str}]}

`tools` and `parallel_tool_calls` are optional; the input's messages (system, user and assistant,
each with a non-empty string `content`) end with the user message the two outputs answer.
datasets.py detects the format and scans the file; this module checks one line's structure, with
the path of the field at fault (`input.messages[1].role`), and tokenizes it with the base's chat
template: the prompt exactly as the chat route serves it (the template with its generation
prompt), and each output as the text the template puts after that prompt, through the
end-of-turn token, so DPO trains the tokens the served model would generate.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from loraloom.platform.training.line_errors import InvalidLine, json_type

PREFERENCE_FIELDS = ("input", "preferred_output", "non_preferred_output")
INPUT_FIELDS = ("messages", "tools", "parallel_tool_calls")
INPUT_ROLES = ("system", "user", "assistant")
OUTPUT_FIELDS = ("preferred_output", "non_preferred_output")


@dataclass(frozen=True)
class PreferenceExample:
    line: int
    prompt_ids: tuple[int, ...]  # the conversation up to the answer, with the template's generation prompt
    chosen_ids: tuple[int, ...]  # the preferred answer through its end-of-turn token
    rejected_ids: tuple[int, ...]  # the non-preferred one

    @property
    def token_count(self) -> int:
        """Tokens through the model per training pass: the prompt twice, once before each answer."""
        return 2 * len(self.prompt_ids) + len(self.chosen_ids) + len(self.rejected_ids)

    @property
    def num_trained_tokens(self) -> int:
        """Tokens whose log-probabilities the DPO loss sums: both answers'."""
        return len(self.chosen_ids) + len(self.rejected_ids)

    @property
    def longest_sequence(self) -> int:
        """The longer of the two sequences the model reads (prompt + answer): what max_seq_len bounds."""
        return len(self.prompt_ids) + max(len(self.chosen_ids), len(self.rejected_ids))


class ChatRenderer(Protocol):
    """What encoding needs of the dataset encoder: the base's tokenizer and chat template."""

    tokenizer: object

    def render(self, messages: list[dict], add_generation_prompt: bool, tools: list[dict] | None = None) -> str: ...

    def answer_span(self, turn: str, answer_start: int, content: str) -> tuple[int, int]: ...


def check_preference_record(record: dict) -> None:
    """Raise InvalidLine for the first problem of a preference line whose top-level fields are right."""
    source = record["input"]
    if not isinstance(source, dict):
        raise InvalidLine("invalid_type", f"input must be an object with messages, got a JSON {json_type(source)}",
                          "input")
    for field in source:
        if field not in INPUT_FIELDS:
            raise InvalidLine("unexpected_field",
                              f"unexpected field {field!r} in input; it has {', '.join(INPUT_FIELDS)}", f"input.{field}")
    if "messages" not in source:
        raise InvalidLine("missing_field", "input needs the field 'messages'", "input.messages")
    _check_input_messages(source["messages"])
    if "tools" in source:
        tools = source["tools"]
        if not isinstance(tools, list) or not all(isinstance(tool, dict) for tool in tools):
            raise InvalidLine("invalid_type", f"input.tools must be a list of tool objects, got a JSON "
                              f"{json_type(tools)}", "input.tools")
    if "parallel_tool_calls" in source and not isinstance(source["parallel_tool_calls"], bool):
        raise InvalidLine("invalid_type", "input.parallel_tool_calls must be true or false",
                          "input.parallel_tool_calls")
    contents = [_output_content(record[field], field) for field in OUTPUT_FIELDS]
    if contents[0] == contents[1]:
        raise InvalidLine("identical_outputs", "preferred_output and non_preferred_output are the same answer; "
                          "a pair teaches a preference only if its answers differ", "non_preferred_output")


def encode_preference(renderer: ChatRenderer, record: dict, line: int) -> PreferenceExample:
    """The prompt and both answers of a checked preference line, as token ids."""
    source = record["input"]
    messages = [{"role": message["role"], "content": message["content"]} for message in source["messages"]]
    tools = source.get("tools") or None
    if tools and not getattr(renderer.tokenizer, "template_renders_tools", False):
        raise InvalidLine("tools_not_rendered", "the base model's chat template does not show tools to the model, "
                          "so training with them would teach a prompt the server never sends; remove input.tools",
                          "input.tools")
    prompt = _render(renderer, messages, True, tools)
    answers = []
    for field in OUTPUT_FIELDS:
        content = record[field][0]["content"]
        turn = _render(renderer, messages + [{"role": "assistant", "content": content}], False, tools)
        if not turn.startswith(prompt):
            raise RuntimeError("training: the base model's chat template does not render a conversation as a prefix "
                               "of its continuation, so the answers cannot be told from the prompt")
        _, end = renderer.answer_span(turn, len(prompt), content)
        # Everything after the served prompt, up to and with the end-of-turn token: what the model must generate.
        answers.append(tuple(renderer.tokenizer.encode(turn[len(prompt):end], add_special_tokens=False)))
    prompt_ids = tuple(renderer.tokenizer.encode(prompt, add_special_tokens=False))
    return PreferenceExample(line=line, prompt_ids=prompt_ids, chosen_ids=answers[0], rejected_ids=answers[1])


def _render(renderer: ChatRenderer, messages: list[dict], add_generation_prompt: bool, tools: list[dict] | None) -> str:
    try:
        return renderer.render(messages, add_generation_prompt=add_generation_prompt, tools=tools)
    except InvalidLine as invalid:  # the template refused the conversation: it is the input's
        raise InvalidLine(invalid.reason, invalid.message, "input.messages") from invalid


def _check_input_messages(messages: object) -> None:
    param = "input.messages"
    if not isinstance(messages, list) or not messages:
        shown = "an empty list" if isinstance(messages, list) else f"a JSON {json_type(messages)}"
        raise InvalidLine("invalid_type", f"{param} must be a non-empty list of messages, got {shown}", param)
    for index, message in enumerate(messages):
        where = f"{param}[{index}]"
        if not isinstance(message, dict):
            raise InvalidLine("invalid_type", f"{where} must be an object, got a JSON {json_type(message)}", where)
        _check_message_fields(message, where, INPUT_ROLES)
    if messages[-1]["role"] != "user":
        raise InvalidLine("roles_not_alternating", f"the last input message is a {messages[-1]['role']} message; "
                          "it must be the user message that preferred_output and non_preferred_output answer",
                          f"{param}[{len(messages) - 1}].role")


def _output_content(output: object, field: str) -> str:
    if not isinstance(output, list) or len(output) != 1:
        shown = f"{len(output)} messages" if isinstance(output, list) else f"a JSON {json_type(output)}"
        raise InvalidLine("invalid_type", f"{field} must be a list of exactly one assistant message, got {shown}",
                          field)
    message = output[0]
    if not isinstance(message, dict):
        raise InvalidLine("invalid_type", f"{field}[0] must be an object, got a JSON {json_type(message)}",
                          f"{field}[0]")
    _check_message_fields(message, f"{field}[0]", ("assistant",))
    return message["content"]


def _check_message_fields(message: dict, where: str, roles: tuple[str, ...]) -> None:
    for field in message:
        if field not in ("role", "content"):
            raise InvalidLine("unexpected_field", f"unexpected field {field!r} in {where}; a message has role and "
                              "content", f"{where}.{field}")
    for field in ("role", "content"):
        if field not in message:
            raise InvalidLine("missing_field", f"{where} needs the field {field!r}", f"{where}.{field}")
    if message["role"] not in roles:
        raise InvalidLine("invalid_role", f"{where}.role is {message['role']!r}; use {' or '.join(roles)}",
                          f"{where}.role")
    content = message["content"]
    if not isinstance(content, str):
        raise InvalidLine("invalid_type", f"{where}.content must be a string, got a JSON {json_type(content)}",
                          f"{where}.content")
    if not content.strip():
        raise InvalidLine("empty_content", f"{where}.content is empty", f"{where}.content")
