"""Tokenizer and chat template of a Hugging Face checkpoint, without transformers.

Encoding and decoding use the `tokenizers` library on tokenizer.json; chat
prompts are rendered with the checkpoint's Jinja template in a sandbox (templates
come from model repositories, i.e. untrusted code), with the globals Hugging Face
templates expect.
"""
from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

from jinja2 import TemplateError, meta, nodes
from jinja2.ext import Extension
from jinja2.parser import Parser
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer as _RustTokenizer

from loraloom.engine.field_error import RequestFieldError

CHAT_ROLES = ("system", "developer", "user", "assistant", "tool")
# OpenAI's newer name for the system role; chat templates know only "system", so it is rendered as one.
ROLE_RENDERED_AS = {"developer": "system"}
SPECIAL_TOKEN_KEYS = ("bos_token", "eos_token", "unk_token", "pad_token")


class ChatTemplateError(RequestFieldError):
    """A chat request the model's template cannot render (no template, bad messages, template error);
    `field` names the messages (or the one message, or its part) at fault."""


class Tokenizer:
    def __init__(
        self,
        tokenizer: _RustTokenizer,
        special_tokens: dict[str, str],
        eos_token_ids: tuple[int, ...],
        chat_template: str | None,
    ):
        self._tokenizer = tokenizer
        self.special_tokens = special_tokens  # {"bos_token": "<|im_start|>", ...}, only the ones the model defines
        self.eos_token_ids = eos_token_ids
        self.chat_template = chat_template
        self._compiled_template, variables = (
            _compile_template(chat_template) if chat_template is not None else (None, frozenset()))
        # Whether the template shows `tools` to the model itself; if not, the gateway describes them.
        self.template_renders_tools = "tools" in variables

    @classmethod
    def from_dir(cls, model_dir: str | Path) -> "Tokenizer":
        model_dir = Path(model_dir)
        path = model_dir / "tokenizer.json"
        if not path.is_file():
            raise FileNotFoundError(f"tokenizer: {path} not found; the checkpoint needs a fast-tokenizer tokenizer.json")
        tokenizer = _RustTokenizer.from_file(str(path))
        tokenizer_config = _read_json(model_dir / "tokenizer_config.json")
        special_tokens = {
            key: _token_content(tokenizer_config[key])
            for key in SPECIAL_TOKEN_KEYS
            if tokenizer_config.get(key) is not None
        }
        eos_ids = _eos_token_ids(tokenizer, model_dir, special_tokens.get("eos_token"))
        return cls(tokenizer, special_tokens, eos_ids, _read_chat_template(model_dir, tokenizer_config))

    # --- tokens -------------------------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        return self._tokenizer.get_vocab_size(with_added_tokens=True)

    def to_json(self) -> str:
        """The tokenizer.json text, as the grammar compiler (engine/structured_output.py) reads it."""
        return self._tokenizer.to_str()

    def encode(self, text: str, add_special_tokens: bool) -> list[int]:
        return self._tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)

    def id_to_token(self, token_id: int) -> str | None:
        return self._tokenizer.id_to_token(token_id)

    def convert_ids_to_tokens(self, ids: list[int]) -> list[str | None]:
        return [self._tokenizer.id_to_token(token_id) for token_id in ids]

    def token_to_id(self, token: str) -> int | None:
        return self._tokenizer.token_to_id(token)

    def _special_id(self, key: str) -> int | None:
        token = self.special_tokens.get(key)
        return None if token is None else self._tokenizer.token_to_id(token)

    @property
    def bos_token_id(self) -> int | None:
        return self._special_id("bos_token")

    @property
    def eos_token_id(self) -> int | None:
        return self._special_id("eos_token")

    @property
    def pad_token_id(self) -> int | None:
        return self._special_id("pad_token")

    @property
    def all_special_ids(self) -> list[int]:
        """Ids of the added tokens marked special (what skip_special_tokens drops)."""
        return sorted(token_id for token_id, token in self._tokenizer.get_added_tokens_decoder().items() if token.special)

    # --- chat ---------------------------------------------------------------------------

    def with_chat_template(self, chat_template: str) -> "Tokenizer":
        """This tokenizer with another chat template (an adapter's own); raises ValueError if it does not compile."""
        return Tokenizer(self._tokenizer, self.special_tokens, self.eos_token_ids, chat_template)

    def apply_chat_template(
        self, messages: list[dict], add_generation_prompt: bool = True, tools: list[dict] | None = None
    ) -> str:
        """The prompt text for a conversation; encode it with add_special_tokens=False (it carries BOS).
        `tools`: OpenAI's tool definitions, for a template that renders them (template_renders_tools)."""
        if self._compiled_template is None:
            raise ChatTemplateError(
                "messages", "this model has no chat template (no chat_template.jinja, no "
                "tokenizer_config.json 'chat_template'); use the completions endpoint with a raw prompt"
            )
        return render_chat_template(self._compiled_template, messages, add_generation_prompt=add_generation_prompt,
                                    tools=tools, special_tokens=self.special_tokens)

    def encode_chat(
        self, messages: list[dict], add_generation_prompt: bool = True, tools: list[dict] | None = None
    ) -> list[int]:
        return self.encode(self.apply_chat_template(messages, add_generation_prompt, tools), add_special_tokens=False)


def compile_chat_template(source: str):
    """A chat template compiled in the sandbox requests render in; ValueError (caused by Jinja's error,
    which carries the line) if it does not compile."""
    return _compile_template(source)[0]


def render_chat_template(
    template, messages: list[dict], *, add_generation_prompt: bool = True, tools: list[dict] | None = None,
    special_tokens: dict[str, str] | None = None,
) -> str:
    """A compiled template's prompt for `messages`; ChatTemplateError (caused by Jinja's) if it refuses them."""
    normalized = [_normalize_message(message, index) for index, message in enumerate(messages)]
    if not normalized:
        raise ChatTemplateError("messages", "must contain at least one message")
    try:
        return template.render(
            messages=normalized, add_generation_prompt=add_generation_prompt, tools=tools, **(special_tokens or {})
        )
    except TemplateError as error:
        raise ChatTemplateError("messages", f"the model's chat template rejected them: {error}") from error


def _read_json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}


def _token_content(value: str | dict) -> str:
    # Older tokenizer_config.json files store special tokens as AddedToken dicts.
    return value["content"] if isinstance(value, dict) else value


def _eos_token_ids(tokenizer: _RustTokenizer, model_dir: Path, eos_token: str | None) -> tuple[int, ...]:
    """Union of the end-of-sequence ids the checkpoint's files declare, in discovery order.

    Instruct models often stop on a token (e.g. <|eot_id|>, <|im_end|>) that only one of
    generation_config.json, config.json or tokenizer_config.json names.
    """
    ids: list[int] = []
    for file_name in ("generation_config.json", "config.json"):
        value = _read_json(model_dir / file_name).get("eos_token_id")
        ids.extend(value if isinstance(value, list) else [] if value is None else [value])
    if eos_token is not None:
        token_id = tokenizer.token_to_id(eos_token)
        if token_id is None:
            raise ValueError(f"tokenizer: tokenizer_config.json eos_token {eos_token!r} is not in tokenizer.json's vocabulary")
        ids.append(token_id)
    return tuple(dict.fromkeys(int(token_id) for token_id in ids))


def _read_chat_template(model_dir: Path, tokenizer_config: dict) -> str | None:
    """chat_template.jinja wins (transformers 5 writes the template there), then tokenizer_config.json."""
    jinja_path = model_dir / "chat_template.jinja"
    if jinja_path.is_file():
        return jinja_path.read_text()
    template = tokenizer_config.get("chat_template")
    if template is None or isinstance(template, str):
        return template
    # A list of named templates ({"name", "template"}): chat uses the one named "default".
    named = {entry.get("name"): entry.get("template") for entry in template}
    if "default" not in named:
        raise ValueError(
            f"tokenizer: tokenizer_config.json lists chat templates {sorted(map(str, named))} but none named 'default'"
        )
    return named["default"]


def _raise_exception(message: str) -> None:
    raise TemplateError(message)


def _strftime_now(date_format: str) -> str:
    return datetime.now().strftime(date_format)


def _tojson(
    value: object,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # Templates use tojson to show tool schemas to the model: keep non-ASCII text readable and
    # key order as given (Jinja's built-in filter escapes HTML and sorts keys).
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


class _GenerationTag(Extension):
    """`{% generation %}...{% endgeneration %}` marks assistant text for training masks;
    for serving it renders its body unchanged."""

    tags = {"generation"}

    def parse(self, parser: Parser) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.Scope(body).set_lineno(lineno)


def _compile_template(source: str):
    # trim_blocks/lstrip_blocks: Hugging Face renders with these, and templates are written for them.
    environment = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols", _GenerationTag]
    )
    environment.filters["tojson"] = _tojson
    environment.globals["raise_exception"] = _raise_exception
    environment.globals["strftime_now"] = _strftime_now
    try:
        return environment.from_string(source), frozenset(meta.find_undeclared_variables(environment.parse(source)))
    except TemplateError as error:
        raise ValueError(f"tokenizer: the model's chat template does not compile: {error}") from error


def _normalize_message(message: dict, index: int) -> dict:
    """Checked copy of one message with `content` as a string (list-of-parts joined by newlines)."""
    if not isinstance(message, dict):
        raise ChatTemplateError(f"messages[{index}]", "must be an object with 'role' and 'content'")
    role = message.get("role")
    if role not in CHAT_ROLES:
        raise ChatTemplateError(f"messages[{index}].role", f"{role!r} is not one of {', '.join(CHAT_ROLES)}")
    content = message.get("content")
    if isinstance(content, list):
        texts = []
        for part_index, part in enumerate(content):
            if not (isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)):
                raise ChatTemplateError(
                    f"messages[{index}].content[{part_index}]", "only text parts {'type': 'text', 'text': str} are supported"
                )
            texts.append(part["text"])
        content = "\n".join(texts)
    elif content is None and message.get("tool_calls"):
        content = ""  # an assistant turn that only called tools
    elif not isinstance(content, str):
        raise ChatTemplateError(f"messages[{index}].content", "must be a string or a list of text parts")
    return {**message, "role": ROLE_RENDERED_AS.get(role, role), "content": content}
