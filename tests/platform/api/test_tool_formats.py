"""Tool-call formats on canned model outputs: `auto` answers of each family parse into calls (or stay
content), a stream fed piece by piece gives the same answer as the whole text, constrained grammars
accept exactly the family's format, and templates see the tools and past calls as they expect."""
from __future__ import annotations

import json

import pytest

from loraloom.engine.structured_output import GrammarCompiler
from loraloom.engine.tokenizer import Tokenizer
from loraloom.platform.api.tools.formats import (
    AUTO,
    MAX_PARALLEL_CALLS,
    TOOL_FORMATS,
    TOOL_PARSER_CHOICES,
    Function,
    ToolCall,
    choose_format,
    format_for_template,
)
from loraloom.platform.api.tools.prompt import template_input
from loraloom.platform.api.tools.request import ToolRequest
from loraloom.platform.api.tools.results import ToolStream, tool_answer

KNOWN = {"get_weather", "get_time"}
WEATHER = ToolCall("get_weather", '{"city": "Paris"}')
TIME = ToolCall("get_time", '{"zone": "UTC", "exact": true}')

# (format, model output, expected content, expected calls)
CANNED = [
    ("smollm2", '<tool_call>[{"name": "get_weather", "arguments": {"city": "Paris"}}]</tool_call>', None, [WEATHER]),
    ("smollm2", 'Let me check.\n<tool_call>[{"name": "get_weather", "arguments": {"city": "Paris"}}, '
                '{"name": "get_time", "arguments": {"zone": "UTC", "exact": true}}]</tool_call>',
     "Let me check.", [WEATHER, TIME]),
    ("smollm2", '<tool_call>{"name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\"}"}</tool_call>', None,
     [WEATHER]),
    ("hermes", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>', None, [WEATHER]),
    ("hermes", 'Sure.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
               '<tool_call>\n{"name": "get_time", "arguments": {"zone": "UTC", "exact": true}}\n</tool_call>',
     "Sure.", [WEATHER, TIME]),
    ("llama3_json", '{"name": "get_weather", "parameters": {"city": "Paris"}}', None, [WEATHER]),
    ("llama3_json", '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}; '
                    '{"name": "get_time", "parameters": {"zone": "UTC", "exact": true}}', None, [WEATHER, TIME]),
    ("llama3_json", ' {"name": "get_time", "arguments": {"zone": "UTC", "exact": true}}', None, [TIME]),
]
# Text in which a call to an offered function began, but which does not read as calls as a whole: a
# whole answer keeps it as content; a stream has sent the call as it came by then, and it stands.
BEGUN_CALLS = [
    ("smollm2", '<tool_call>[{"name": "get_weather", "arguments": {"city": "Par'),  # cut short
    ("llama3_json", '{"name": "get_weather", "parameters": {"city": "Paris"}} and more words'),
]
# Text that is no call: left whole as content.
NEVER_CALLS = [
    ("smollm2", "Paris is sunny today."),
    ("smollm2", '<tool_call>[{"name": "launch_rockets", "arguments": {}}]</tool_call>'),  # not offered
    ("hermes", "<tool_call>\nnot json\n</tool_call>"),
    ("llama3_json", 'The JSON would be {"name": "get_weather"}'),  # calls only open the answer
    # Arguments as a JSON string, and a call that is none: read whole at the end, never streamed.
    ("smollm2", '<tool_call>[{"name": "get_time", "arguments": "{}"}, {"name": "get_weather", '
                '"arguments": {"city": "Paris"}}, 7]</tool_call>'),
]
NOT_CALLS = BEGUN_CALLS + NEVER_CALLS


def auto_request(parallel: bool = True) -> ToolRequest:
    return ToolRequest([Function(name, None, {"type": "object"}) for name in sorted(KNOWN)], "auto", parallel)


@pytest.mark.parametrize(("name", "text", "content", "calls"), CANNED)
def test_auto_answers_parse_into_calls(name, text, content, calls):
    answer = tool_answer(text, "stop", auto_request(), TOOL_FORMATS[name])
    assert answer.content == content
    assert [(call.function.name, json.loads(call.function.arguments)) for call in answer.tool_calls] == [
        (call.name, json.loads(call.arguments)) for call in calls]
    assert answer.finish_reason == "tool_calls"


@pytest.mark.parametrize(("name", "text"), NOT_CALLS)
def test_text_that_is_no_call_stays_content(name, text):
    answer = tool_answer(text, "length", auto_request(), TOOL_FORMATS[name])
    assert (answer.content, answer.tool_calls, answer.finish_reason) == (text, None, "length")


def test_parallel_tool_calls_false_keeps_the_first_call():
    text = CANNED[1][1]
    answer = tool_answer(text, "stop", auto_request(parallel=False), TOOL_FORMATS["smollm2"])
    assert [call.function.name for call in answer.tool_calls] == ["get_weather"]


def streamed(name: str, text: str, piece: int, finish: str = "stop", parallel: bool = True,
             ) -> tuple[str, list[tuple[str, str]], str | None]:
    """Feed `text` in pieces of `piece` characters: (content sent, (name, arguments) per call, finish)."""
    reader = ToolStream(auto_request(parallel), TOOL_FORMATS[name])
    content, deltas = "", []
    for start in range(0, len(text), piece):
        sent, new = reader.feed(text[start:start + piece])
        content, deltas = content + sent, deltas + new
    rest, last, finish_reason = reader.finish(finish)
    deltas += last
    calls: dict[int, list[str]] = {}
    for delta in deltas:
        if delta.id is not None:
            assert delta.function.name and delta.function.arguments == "" and delta.index not in calls
            calls[delta.index] = [delta.function.name, ""]
        calls[delta.index][1] += delta.function.arguments
    return content + rest, [tuple(call) for _, call in sorted(calls.items())], finish_reason


@pytest.mark.parametrize("piece", [1, 3, 1000])
@pytest.mark.parametrize(("name", "text", "content", "calls"), CANNED + [(n, t, t, []) for n, t in NEVER_CALLS])
def test_a_stream_gives_what_the_whole_text_gives(name, text, content, calls, piece):
    whole = tool_answer(text, "stop", auto_request(), TOOL_FORMATS[name])
    sent, streamed_calls, finish_reason = streamed(name, text, piece)
    assert streamed_calls == [(call.function.name, call.function.arguments) for call in whole.tool_calls or []]
    assert finish_reason == whole.finish_reason
    # Content before the calls is sent as it comes (never any of the calls' text).
    assert sent.strip() == (whole.content or "").strip()


@pytest.mark.parametrize("name", sorted(TOOL_FORMATS))
def test_free_calls_stream_their_arguments_as_they_come(name):
    """An auto answer fed a character at a time: content first, then each call's head as soon as its
    arguments open, its arguments in fragments before the answer ends, and nothing left for the end."""
    tool_format = TOOL_FORMATS[name]
    prefix = "" if name == "llama3_json" else "Let me check. "  # Llama's calls only open the answer
    text = prefix + tool_format.write([WEATHER, TIME])
    reader = ToolStream(auto_request(), tool_format)
    content, fed = "", []  # (characters fed when the delta came, delta)
    for position in range(len(text)):
        sent, deltas = reader.feed(text[position])
        content += sent
        fed += [(position + 1, delta) for delta in deltas]
    assert reader.finish("stop") == ("", [], "tool_calls")
    assert content == prefix
    heads = [(at, delta) for at, delta in fed if delta.id is not None]
    assert [delta.function.name for _, delta in heads] == ["get_weather", "get_time"]
    assert heads[0][0] == text.index('{"city"') + 1  # the arguments' brace completes the head
    for index, call in enumerate([WEATHER, TIME]):
        fragments = [delta.function.arguments for _, delta in fed if delta.index == index and delta.id is None]
        assert len(fragments) > 1 and "".join(fragments) == call.arguments


def test_free_calls_stream_as_the_model_spaced_them():
    text = '<tool_call>[{"name":"get_weather","arguments":{"city":"Paris"}}]</tool_call>'
    whole = tool_answer(text, "stop", auto_request(), TOOL_FORMATS["smollm2"])
    sent, calls, finish_reason = streamed("smollm2", text, 2)
    assert calls == [("get_weather", '{"city":"Paris"}')] and finish_reason == "tool_calls" and sent == ""
    assert json.loads(calls[0][1]) == json.loads(whole.tool_calls[0].function.arguments)


@pytest.mark.parametrize(("name", "text"), BEGUN_CALLS)
@pytest.mark.parametrize("finish", ["length", "stop"])
def test_a_call_that_began_stands_as_it_was_sent(name, text, finish):
    """The whole answer would be content; the stream has sent the call by then, and keeps it (as a
    constrained call cut short): no content, the finish reason of calls unless max_tokens cut it."""
    sent, calls, finish_reason = streamed(name, text, 1, finish=finish)
    assert [call_name for call_name, _ in calls] == ["get_weather"] and sent == ""
    assert text.find(calls[0][1]) > 0  # the arguments as written, as far as they got
    assert finish_reason == ("length" if finish == "length" else "tool_calls")


def test_a_stream_without_parallel_calls_sends_the_first_call_only():
    assert streamed("smollm2", CANNED[1][1], 1, parallel=False)[1] == [("get_weather", WEATHER.arguments)]


def test_content_streams_before_the_calls_are_known():
    reader = ToolStream(auto_request(), TOOL_FORMATS["smollm2"])
    assert reader.feed("Let me ") == ("Let me ", [])
    assert reader.feed("check <tool") == ("check ", [])  # "<tool" may open a call: held
    assert reader.feed("_call>[") == ("", [])


@pytest.fixture(scope="module")
def tokenizer(model_dir) -> Tokenizer:
    return Tokenizer.from_dir(model_dir)


@pytest.fixture(scope="module")
def compiler(tokenizer) -> GrammarCompiler:
    return GrammarCompiler(tokenizer.to_json(), tokenizer.vocab_size, tokenizer.eos_token_ids)


FUNCTIONS = [Function("get_weather", None, {"type": "object", "properties": {"city": {"type": "string"}},
                                            "required": ["city"], "additionalProperties": False}),
             Function("get_time", None, {"type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]},
                                                                          "exact": {"type": "boolean"}},
                                         "required": ["zone", "exact"], "additionalProperties": False})]


def accepts(compiler: GrammarCompiler, tokenizer: Tokenizer, grammar: str, text: str) -> bool:
    matcher = compiler.compile(grammar).matcher()
    for token in tokenizer.encode(text, add_special_tokens=False):
        matcher.accept(token)
    return matcher._matcher.is_accepting() and not matcher._matcher.is_error()


@pytest.mark.parametrize("name", sorted(TOOL_FORMATS))
def test_grammars_accept_the_family_format_and_nothing_else(compiler, tokenizer, name):
    tool_format = TOOL_FORMATS[name]
    one, two = tool_format.write([WEATHER]), tool_format.write([WEATHER, TIME])
    single, parallel = tool_format.grammar(FUNCTIONS, parallel=False), tool_format.grammar(FUNCTIONS, parallel=True)
    assert accepts(compiler, tokenizer, single, one) and accepts(compiler, tokenizer, parallel, two)
    assert not accepts(compiler, tokenizer, single, two)  # one call only without parallel calls
    assert not accepts(compiler, tokenizer, parallel, tool_format.write([WEATHER] * (MAX_PARALLEL_CALLS + 1)))
    bad_enum = tool_format.write([ToolCall("get_time", '{"zone": "PST", "exact": true}')])
    unknown = tool_format.write([ToolCall("get_date", '{}')])
    wrong_format = TOOL_FORMATS["hermes" if name != "hermes" else "smollm2"].write([WEATHER])
    for text in (bad_enum, unknown, wrong_format):
        assert not accepts(compiler, tokenizer, parallel, text), text


def test_every_parser_name_the_settings_declare_has_a_format():
    """settings.py declares the names (the registry checks adapters against them); each is a format here."""
    assert TOOL_PARSER_CHOICES == (AUTO, *TOOL_FORMATS)


def test_formats_follow_the_template_or_the_choice():
    assert format_for_template("{{ '<|start_header_id|>' }}").name == "llama3_json"
    assert format_for_template("{{ '<tool_call>\\n' + tool_call | tojson }}").name == "hermes"
    assert format_for_template("{{ '<|im_start|>' }}").name == "smollm2"
    assert format_for_template(None).name == "smollm2"
    assert choose_format("hermes", "{{ '<|start_header_id|>' }}").name == "hermes"
    with pytest.raises(ValueError, match="not one of"):
        choose_format("xml", None)


TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": FUNCTIONS[0].parameters}}]
HISTORY = [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "tool_calls": [{"id": "call_1", "type": "function",
                                          "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
]
# A Llama 3.1-style template (written for this test): tools in the system turn, one call per assistant
# turn with its arguments as an object, results in an ipython turn.
LLAMA_STYLE = (
    "{{ bos_token }}{% if tools %}<|start_header_id|>system<|end_header_id|>\n\n"
    "{% for tool in tools %}{{ tool | tojson }}\n{% endfor %}<|eot_id|>{% endif %}"
    "{% for message in messages %}"
    "{% if message.tool_calls %}<|start_header_id|>assistant<|end_header_id|>\n\n"
    "{% set call = message.tool_calls[0].function %}"
    "{{ '{\"name\": \"' + call.name + '\", \"parameters\": ' + call.arguments | tojson + '}' }}<|eot_id|>"
    "{% elif message.role == 'tool' %}<|start_header_id|>ipython<|end_header_id|>\n\n{{ message.content }}<|eot_id|>"
    "{% else %}<|start_header_id|>{{ message.role }}<|end_header_id|>\n\n{{ message.content }}<|eot_id|>{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)


def test_a_template_that_renders_tools_gets_them_and_the_calls_as_objects(tokenizer):
    llama = tokenizer.with_chat_template(LLAMA_STYLE)
    assert llama.template_renders_tools and not tokenizer.template_renders_tools
    tool_format = format_for_template(llama.chat_template)
    messages, tools = template_input(HISTORY, TOOLS, describe_tools=True, renders_tools=True, tool_format=tool_format)
    prompt = llama.apply_chat_template(messages, tools=tools)
    assert '{"name": "get_weather", "parameters": {"city": "Paris"}}<|eot_id|>' in prompt
    assert json.dumps(TOOLS[0]) in prompt and "<|start_header_id|>ipython<|end_header_id|>\n\nsunny" in prompt


def test_the_bundled_template_gets_tools_described_and_calls_written(tokenizer):
    tool_format = format_for_template(tokenizer.chat_template)
    messages, tools = template_input(HISTORY, TOOLS, describe_tools=True, renders_tools=False,
                                     tool_format=tool_format)
    assert tools is None
    prompt = tokenizer.apply_chat_template(messages)
    assert prompt.startswith("<|im_start|>system\nYou can call functions.")
    assert f"<tools>{json.dumps(TOOLS)}</tools>" in prompt
    assert ('<|im_start|>assistant\n<tool_call>[{"name": "get_weather", "arguments": {"city": "Paris"}}]'
            '</tool_call><|im_end|>') in prompt
    assert "<|im_start|>tool\nsunny<|im_end|>" in prompt
    quiet, _ = template_input(HISTORY, TOOLS, describe_tools=False, renders_tools=False, tool_format=tool_format)
    assert "<tools>" not in tokenizer.apply_chat_template(quiet)


def test_parameters_with_definitions_compile_against_their_own_root(compiler, tokenizer):
    """$defs references are written against the parameters' schema: they still resolve inside a call."""
    function = Function("pick", None, {"type": "object", "properties": {"level": {"$ref": "#/$defs/Level"}},
                                       "required": ["level"], "additionalProperties": False,
                                       "$defs": {"Level": {"type": "integer", "minimum": 0, "maximum": 3}}})
    tool_format = TOOL_FORMATS["smollm2"]
    grammar = tool_format.grammar([function], parallel=False)
    assert accepts(compiler, tokenizer, grammar, tool_format.write([ToolCall("pick", '{"level": 2}')]))
    assert not accepts(compiler, tokenizer, grammar, tool_format.write([ToolCall("pick", '{"level": 7}')]))


def test_a_schema_the_grammar_cannot_take_is_named_shortly(compiler):
    bad = Function("f", None, {"type": "object", "properties": {"a": {"type": "foo"}}})
    with pytest.raises(ValueError) as refusal:
        compiler.compile(TOOL_FORMATS["hermes"].grammar([bad], parallel=False))
    message = str(refusal.value)
    assert message.startswith("tools: ") and "Invalid type: foo" in message and "call_0" not in message


@pytest.mark.parametrize("name", sorted(TOOL_FORMATS))
def test_constrained_calls_stream_their_arguments_as_they_come(name):
    """A required answer, fed a character at a time: each call's head comes as soon as its name is
    complete, its arguments in fragments before the answer ends, and nothing is left for the end."""
    tool_format = TOOL_FORMATS[name]
    request = ToolRequest([Function(n, None, {"type": "object"}) for n in sorted(KNOWN)], "required", True)
    reader = ToolStream(request, tool_format)
    text = tool_format.write([WEATHER, TIME])
    fed: list[tuple[int, object]] = []  # (characters fed when the delta came, delta)
    for position in range(len(text)):
        content, deltas = reader.feed(text[position])
        assert content == ""
        fed += [(position + 1, delta) for delta in deltas]
    assert reader.finish("stop") == ("", [], "tool_calls")
    heads = [(at, delta) for at, delta in fed if delta.id is not None]
    assert [delta.function.name for _, delta in heads] == ["get_weather", "get_time"]
    assert heads[0][0] == text.index('"get_weather"') + len('"get_weather", "') + len(tool_format.arguments_key) + 3
    for index, call in enumerate([WEATHER, TIME]):
        fragments = [delta.function.arguments for _, delta in fed if delta.index == index and delta.id is None]
        assert len(fragments) > 1 and "".join(fragments) == call.arguments
