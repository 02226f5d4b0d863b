"""An adapter's own chat template: taken from an upload (or a server-local adapter's directory),
checked, stored beside the weights.

PEFT saves a fine-tune's tokenizer files beside the adapter; the chat template is the one that
matters to serving (the tokens themselves must be the base's). An upload may carry it as
`chat_template.jinja` (transformers 5) or as tokenizer_config.json's `chat_template` (older); it is
kept as `chat_template.jinja`, one more content-addressed file of the version, and requests to that
version render their conversation with it.

It is checked at upload by compiling it and rendering a short conversation in the same sandbox
requests use, so a template that cannot serve is a 400 naming its line, and nothing is stored. A
server-local adapter's (`serve --adapter`, `--adapter-dir`: registry/local.py) is read and checked the
same way, by find_chat_template, when the server lists or resolves it.
"""
from __future__ import annotations

import json
import traceback
from pathlib import Path

from jinja2 import TemplateSyntaxError

from loraloom.engine import ChatTemplateError, compile_chat_template, render_chat_template
from loraloom.platform.registry.errors import UploadRejectedError

CHAT_TEMPLATE_FILE = "chat_template.jinja"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
# Templates are code run per request: a bound keeps a mistaken upload (a whole tokenizer) out.
MAX_CHAT_TEMPLATE_BYTES = 64 * 1024
MAX_TOKENIZER_CONFIG_BYTES = 4 * 1024 * 1024
# What a template must render to be accepted: a conversation every chat template takes.
TEST_CONVERSATION = [
    {"role": "user", "content": "Hello."},
    {"role": "assistant", "content": "Hello! How can I help?"},
    {"role": "user", "content": "What is the capital of France?"},
]
PARAM = "chat_template"


def find_chat_template(directory: Path) -> str | None:
    """The chat template a directory of adapter files holds, checked: chat_template.jinja, else
    tokenizer_config.json's `chat_template` (chat_template.jinja wins, as in transformers); None if
    neither has one. The one answer to "which file holds the template", for every upload route and for
    server-local adapters alike."""
    template_path = directory / CHAT_TEMPLATE_FILE
    config_path = directory / TOKENIZER_CONFIG_FILE
    if template_path.is_file():
        template = _read_template(template_path)
    elif config_path.is_file():
        template = _template_in_config(config_path)
    else:
        return None
    if template is not None:
        check_chat_template(template)
    return template


def gather_chat_template(directory: Path) -> None:
    """Leave the staged upload in `directory` with its template (find_chat_template's) as
    chat_template.jinja, if it has one, and no tokenizer_config.json, whose other fields are not kept."""
    template = find_chat_template(directory)
    (directory / TOKENIZER_CONFIG_FILE).unlink(missing_ok=True)
    template_path = directory / CHAT_TEMPLATE_FILE
    if template is not None and not template_path.is_file():  # an uploaded one stays byte for byte
        template_path.write_bytes(template.encode("utf-8"))


def _template_in_config(path: Path) -> str | None:
    if path.stat().st_size > MAX_TOKENIZER_CONFIG_BYTES:
        raise UploadRejectedError(f"files: {TOKENIZER_CONFIG_FILE} is over {MAX_TOKENIZER_CONFIG_BYTES} bytes; "
                                  f"upload the template alone as {CHAT_TEMPLATE_FILE}", param=PARAM)
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as error:
        raise UploadRejectedError(f"files: {TOKENIZER_CONFIG_FILE} is not JSON ({error})", param=PARAM) from None
    template = config.get("chat_template") if isinstance(config, dict) else None
    if template is None or isinstance(template, str):
        return template
    # A list of named templates: chat uses the one named "default", as transformers does.
    if isinstance(template, list):
        named = {entry.get("name"): entry.get("template") for entry in template if isinstance(entry, dict)}
        if isinstance(named.get("default"), str):
            return named["default"]
    raise UploadRejectedError(f"chat_template: {TOKENIZER_CONFIG_FILE}'s chat_template must be a string or a list "
                              "of named templates with one named \"default\"", param=PARAM)


def _read_template(path: Path) -> str:
    if path.stat().st_size > MAX_CHAT_TEMPLATE_BYTES:  # before reading: it may be a whole tokenizer
        raise _too_large(path.stat().st_size)
    try:
        return path.read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        raise UploadRejectedError("chat_template: not UTF-8 text", param=PARAM) from None


def _too_large(size: int) -> UploadRejectedError:
    return UploadRejectedError(f"chat_template: {size} bytes; at most {MAX_CHAT_TEMPLATE_BYTES} are accepted",
                               param=PARAM)


def check_chat_template(source: str) -> None:
    """Compile `source` and render the test conversation; a fault is refused naming its line."""
    if len(source.encode("utf-8")) > MAX_CHAT_TEMPLATE_BYTES:
        raise _too_large(len(source.encode("utf-8")))
    try:
        template = compile_chat_template(source)
    except ValueError as error:
        cause = error.__cause__
        line = cause.lineno if isinstance(cause, TemplateSyntaxError) else None
        raise _refusal(line, str(cause or error)) from None
    try:
        render_chat_template(template, TEST_CONVERSATION)
    except ChatTemplateError as error:
        raise _refusal(_template_line(error.__cause__), str(error.__cause__ or error)) from None
    except Exception as error:  # a template's own fault at render time (a type error in its code, ...)
        raise _refusal(_template_line(error), f"{type(error).__name__}: {error}") from None


def _template_line(error: BaseException | None) -> int | None:
    """The template line a render error was raised on: Jinja rewrites its traceback to template lines."""
    if error is None:
        return None
    lines = [frame.lineno for frame in traceback.extract_tb(error.__traceback__) if frame.filename == "<template>"]
    return lines[-1] if lines else None


def _refusal(line: int | None, detail: str) -> UploadRejectedError:
    where = f" line {line}" if line is not None else ""
    return UploadRejectedError(
        f"chat_template:{where}: {detail}; it must compile and render a user/assistant conversation",
        param=PARAM,
    )

