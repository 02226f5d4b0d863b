"""Our tokenizer and chat template against transformers' AutoTokenizer on the bundled model."""
from __future__ import annotations

import json
import shutil

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from loraloom.engine.tokenizer import ChatTemplateError, Tokenizer

TEXTS = [
    "Hello, world!",
    "  leading spaces and\ttabs\nnew lines\n\n",
    "Ünïcödé — 漢字 and emoji 🚀🙂",
    "<|im_start|>user\nspecial tokens inside text<|im_end|>",
    "def f(x):\n    return x ** 2  # code",
    "",
]
CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "You answer in French."}, {"role": "user", "content": "Hi!"}],
    [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Name a color."},
        {"role": "assistant", "content": "Blue."},
        {"role": "user", "content": "Another one?"},
    ],
    [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}],
]


@pytest.fixture(scope="module")
def ours(model_dir):
    return Tokenizer.from_dir(model_dir)


@pytest.fixture(scope="module")
def theirs(model_dir):
    return AutoTokenizer.from_pretrained(model_dir)


@pytest.mark.parametrize("add_special_tokens", [True, False])
def test_encode_and_decode_equal_transformers(ours, theirs, add_special_tokens):
    for text in TEXTS:
        ids = ours.encode(text, add_special_tokens=add_special_tokens)
        assert ids == theirs.encode(text, add_special_tokens=add_special_tokens), text
        for skip in (True, False):
            assert ours.decode(ids, skip_special_tokens=skip) == theirs.decode(ids, skip_special_tokens=skip)
        assert ours.convert_ids_to_tokens(ids) == theirs.convert_ids_to_tokens(ids)


def test_vocabulary_and_special_tokens(ours, theirs):
    assert ours.vocab_size == len(theirs)
    assert ours.bos_token_id == theirs.bos_token_id
    assert ours.eos_token_id == theirs.eos_token_id
    assert ours.pad_token_id == theirs.pad_token_id
    assert ours.all_special_ids == sorted(i for i, token in theirs.added_tokens_decoder.items() if token.special)
    assert theirs.convert_tokens_to_ids("<|im_end|>") in ours.eos_token_ids
    assert ours.id_to_token(theirs.convert_tokens_to_ids("<|im_start|>")) == "<|im_start|>"


@pytest.mark.parametrize("conversation", CONVERSATIONS)
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_chat_template_equals_transformers(ours, theirs, conversation, add_generation_prompt):
    expected = theirs.apply_chat_template(conversation, tokenize=False, add_generation_prompt=add_generation_prompt)
    assert ours.apply_chat_template(conversation, add_generation_prompt=add_generation_prompt) == expected
    assert ours.encode_chat(conversation, add_generation_prompt) == theirs.encode(expected, add_special_tokens=False)


def test_developer_role_renders_as_system(ours):
    developer = [{"role": "developer", "content": "Be brief."}, {"role": "user", "content": "Hi!"}]
    system = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}]
    assert ours.apply_chat_template(developer) == ours.apply_chat_template(system)
    assert "developer" not in ours.apply_chat_template(developer)


def test_text_parts_render_like_a_string(ours):
    parts = [{"role": "user", "content": [{"type": "text", "text": "first"}, {"type": "text", "text": "second"}]}]
    plain = [{"role": "user", "content": "first\nsecond"}]
    assert ours.apply_chat_template(parts) == ours.apply_chat_template(plain)


@pytest.mark.parametrize(
    ("messages", "field"),
    [
        ([], "at least one"),
        ([{"role": "robot", "content": "hi"}], r"messages\[0\]\.role"),
        ([{"role": "user", "content": "a"}, {"role": "user", "content": 3}], r"messages\[1\]\.content"),
        ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}], r"content\[0\]"),
    ],
)
def test_invalid_messages_name_the_field(ours, messages, field):
    with pytest.raises(ChatTemplateError, match=field):
        ours.apply_chat_template(messages)


def _copy_tokenizer(model_dir, destination, tokenizer_config_edit):
    destination.mkdir()
    shutil.copy(model_dir / "tokenizer.json", destination)
    tokenizer_config = json.loads((model_dir / "tokenizer_config.json").read_text())
    tokenizer_config_edit(tokenizer_config)
    (destination / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    return destination


def test_model_without_chat_template_refuses_chat(model_dir, tmp_path):
    tokenizer = Tokenizer.from_dir(_copy_tokenizer(model_dir, tmp_path / "plain", lambda config: None))
    assert tokenizer.encode("plain completion", add_special_tokens=True)
    with pytest.raises(ChatTemplateError, match="no chat template"):
        tokenizer.apply_chat_template([{"role": "user", "content": "hi"}])


def test_named_templates_use_default_and_template_globals(model_dir, tmp_path):
    default = (
        "{{ bos_token }}{% for m in messages %}{{ m['role'] }}:{{ m['content'] }}{{ eos_token }}{% endfor %}"
        "{% if add_generation_prompt %}assistant:{% endif %}{% if tools is none %}[no tools]{% endif %}"
        "{% if messages|length > 2 %}{{ raise_exception('too many messages') }}{% endif %}"
        "{{ strftime_now('%Y')|length }}"
    )
    templates = [{"name": "tool_use", "template": "unused"}, {"name": "default", "template": default}]
    directory = _copy_tokenizer(model_dir, tmp_path / "named", lambda config: config.update(chat_template=templates))
    tokenizer = Tokenizer.from_dir(directory)
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}])
    assert rendered == "<|im_start|>user:hi<|im_end|>assistant:[no tools]4"
    too_many = [{"role": "user", "content": "a"}] * 3
    with pytest.raises(ChatTemplateError, match="too many messages"):
        tokenizer.apply_chat_template(too_many)


def test_greedy_answer_through_our_chat_prompt(model_dir, ours):
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    prompt = ours.encode_chat([{"role": "user", "content": "What is the capital of France?"}])
    with torch.no_grad():
        output = model.generate(
            torch.tensor([prompt]), max_new_tokens=24, do_sample=False, eos_token_id=list(ours.eos_token_ids)
        )
    answer = ours.decode(output[0, len(prompt):].tolist())
    assert "Paris" in answer, answer
