"""Incremental detokenization against the tokenizer's own full decode.

Two real tokenizers: the bundled SmolLM2 one (byte-level BPE: a CJK character or
an emoji is split into byte pieces) and a small SentencePiece-style BPE trained
here with byte fallback (<0xE2>-style tokens, and a decoder that strips the
leading space of the text it decodes).
"""
from __future__ import annotations

import queue
import threading
from pathlib import Path

import pytest
from tokenizers import Tokenizer as RustTokenizer
from tokenizers import decoders, models, normalizers, trainers

from loraloom.engine.model.bundled import import_bundled
from loraloom.engine.detokenizer import PROMPT_CONTEXT_TOKENS, DeferredDetokenizer, IncrementalDetokenizer
from loraloom.engine.outputs import RequestOutput
from loraloom.engine.tokenizer import Tokenizer

TEXTS = [
    "Héllo wörld, naïve café — déjà vu à Zürich. Ça va? ñandú, Øresund, Łódź.",
    "日本語のテキストです。中文也可以，한국어도 됩니다。",
    "Emoji: 😀👍🏽🎉 family 👨‍👩‍👧 flags 🇫🇷🇯🇵 and 🧑🏿‍🚀!",
    'def f(x: int) -> int:\n\treturn x ** 2  # square\n\nprint(f"{f(3)=}")\n',
    "  leading spaces,\n\n\ttabs\t and   runs   of   spaces  \r\n trailing ",
    "Math: ∑ᵢ xᵢ² ≤ ∞, arrows → ⇒, ℝⁿ; mixed 日本 code `x≠y` 🎉end",
]
PROMPT = "User: repeat after me, exactly.\nAssistant:"


@pytest.fixture(scope="module")
def model_dir() -> Path:
    return import_bundled()


@pytest.fixture(scope="module", params=["tokenizers", "engine"])
def bundled(request, model_dir):
    """The bundled tokenizer, raw and through engine.tokenizer.Tokenizer: both must work."""
    if request.param == "tokenizers":
        return RustTokenizer.from_file(str(model_dir / "tokenizer.json"))
    return Tokenizer.from_dir(model_dir)


@pytest.fixture(scope="module")
def byte_fallback(tmp_path_factory) -> RustTokenizer:
    """A Llama-2-like tokenizer: ▁ for spaces, <0xXX> tokens for anything outside its tiny vocab."""
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=[f"<0x{b:02X}>" for b in range(256)], show_progress=False
    )
    normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    trained = RustTokenizer(models.BPE(byte_fallback=True))
    trained.normalizer = normalizer
    trained.train_from_iterator(["hello world, this is a test of the tokenizer", "the quick brown fox"] * 10, trainer)
    # Reload the learned vocab as plain tokens: as trainer specials, skip_special_tokens would drop the bytes.
    vocab_file, merges_file = trained.model.save(str(tmp_path_factory.mktemp("byte_fallback")))
    tokenizer = RustTokenizer(models.BPE.from_file(vocab_file, merges_file, byte_fallback=True))
    tokenizer.normalizer = normalizer
    tokenizer.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    return tokenizer


def encode(tokenizer: RustTokenizer | Tokenizer, text: str) -> list[int]:
    if isinstance(tokenizer, RustTokenizer):
        return tokenizer.encode(text, add_special_tokens=False).ids
    return tokenizer.encode(text, add_special_tokens=False)


def stream(detokenizer: IncrementalDetokenizer, output_ids: list[int]) -> list[str]:
    return [detokenizer.step(token_id) for token_id in output_ids] + [detokenizer.flush()]


def expected_continuation(tokenizer, prompt_ids: list[int], output_ids: list[int], skip_special_tokens: bool) -> str:
    """What the output adds to the prompt's text: the full decode, minus the prompt's decode."""
    full = tokenizer.decode(prompt_ids + output_ids, skip_special_tokens=skip_special_tokens)
    prompt = tokenizer.decode(prompt_ids, skip_special_tokens=skip_special_tokens)
    assert full.startswith(prompt)
    return full[len(prompt) :]


@pytest.mark.parametrize("text", TEXTS)
def test_bundled_deltas_are_whole_characters_and_join_to_the_full_decode(bundled, text):
    prompt_ids, output_ids = encode(bundled, PROMPT), encode(bundled, text)
    deltas = stream(IncrementalDetokenizer(bundled, prompt_ids), output_ids)
    assert all("\ufffd" not in delta for delta in deltas)
    assert "".join(deltas) == bundled.decode(output_ids) == text


def test_bundled_split_character_is_held_back_until_complete(bundled):
    text = "語😀"
    output_ids = encode(bundled, text)
    # After token i, the output so far ends inside a character iff its decode ends in U+FFFD.
    inside_character = [bundled.decode(output_ids[: i + 1]).endswith("\ufffd") for i in range(len(output_ids))]
    # The test is only meaningful if the tokenizer really splits these characters.
    assert any(inside_character)
    detokenizer = IncrementalDetokenizer(bundled, encode(bundled, PROMPT))
    deltas = [detokenizer.step(token_id) for token_id in output_ids]
    for inside, delta in zip(inside_character, deltas):
        if inside:
            assert delta == ""
    assert [d for d in deltas if d] == ["語", "😀"]
    assert detokenizer.flush() == ""


@pytest.mark.parametrize("skip_special_tokens", [True, False])
def test_special_tokens_follow_skip_special_tokens(bundled, skip_special_tokens):
    im_end = bundled.token_to_id("<|im_end|>")
    output_ids = encode(bundled, "Hi 日本") + [im_end] + encode(bundled, " more text")
    detokenizer = IncrementalDetokenizer(bundled, encode(bundled, PROMPT), skip_special_tokens=skip_special_tokens)
    joined = "".join(stream(detokenizer, output_ids))
    assert joined == bundled.decode(output_ids, skip_special_tokens=skip_special_tokens)
    assert ("<|im_end|>" in joined) is not skip_special_tokens


def test_each_step_decodes_only_a_small_window(bundled):
    class CountingDecoder:
        """The real tokenizer, recording the longest id list it was asked to decode."""

        def __init__(self):
            self.longest = 0

        def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
            self.longest = max(self.longest, len(ids))
            return bundled.decode(ids, skip_special_tokens=skip_special_tokens)

    output_ids = encode(bundled, " ".join(TEXTS) * 3)
    assert len(output_ids) > 300
    counting = CountingDecoder()
    joined = "".join(stream(IncrementalDetokenizer(counting, encode(bundled, PROMPT * 10)), output_ids))
    assert joined == bundled.decode(output_ids)
    # Context of the last emission plus the pieces of one pending character: a handful of tokens.
    assert counting.longest <= PROMPT_CONTEXT_TOKENS + 8


@pytest.mark.parametrize("text", ["hello wörld 😀 the fox", "ZZ 日本 x", " the quick ☃ brown", "fox→→the"])
@pytest.mark.parametrize("prompt", ["", "hello world the", "a test of ☃"])
def test_byte_fallback_tokens_and_leading_space_stripping(byte_fallback, text, prompt):
    prompt_ids, output_ids = encode(byte_fallback, prompt), encode(byte_fallback, text)
    assert any(byte_fallback.id_to_token(t).startswith("<0x") for t in output_ids)
    deltas = stream(IncrementalDetokenizer(byte_fallback, prompt_ids), output_ids)
    assert all("\ufffd" not in delta for delta in deltas)
    assert "".join(deltas) == expected_continuation(byte_fallback, prompt_ids, output_ids, skip_special_tokens=True)


def test_a_real_replacement_character_at_the_end_comes_out_on_flush(bundled):
    output_ids = encode(bundled, "odd \ufffd")
    detokenizer = IncrementalDetokenizer(bundled, [])
    emitted = "".join(detokenizer.step(token_id) for token_id in output_ids)
    assert emitted + detokenizer.flush() == "odd \ufffd"


def deferred_outputs(tokenizer, prompt_ids: list[int], output_ids: list[int]) -> list[RequestOutput]:
    """One output per token, as the engine makes them for a request without stop strings."""
    request_tokens: list[int] = []  # the request's output_token_ids, appended one token per step
    deferred = DeferredDetokenizer(IncrementalDetokenizer(tokenizer, prompt_ids), request_tokens)
    outputs = []
    for index, token_id in enumerate(output_ids):
        final = index == len(output_ids) - 1
        request_tokens.append(token_id)
        output = RequestOutput(request_id="r", token_ids=[token_id], logprobs=None,
                               finished=final, finish_reason="length" if final else None,
                               num_prompt_tokens=len(prompt_ids), num_output_tokens=index + 1, num_cached_tokens=0,
                               deferred=deferred)
        outputs.append(output)
    return outputs


def eager_deltas(tokenizer, prompt_ids: list[int], output_ids: list[int]) -> list[str]:
    """What the step loop would have computed: one delta per token, the flush joined to the last."""
    deltas = stream(IncrementalDetokenizer(tokenizer, prompt_ids), output_ids)
    return deltas[:-2] + [deltas[-2] + deltas[-1]]


def test_deferred_deltas_equal_the_eager_ones_whatever_the_read_order(bundled):
    prompt_ids, output_ids = encode(bundled, PROMPT), encode(bundled, TEXTS[2] + TEXTS[1] + "odd \ufffd")
    outputs = deferred_outputs(bundled, prompt_ids, output_ids)
    middle = len(outputs) // 2
    read = {index: outputs[index].text_delta for index in [middle, *reversed(range(len(outputs)))]}
    assert [read[index] for index in range(len(outputs))] == eager_deltas(bundled, prompt_ids, output_ids)
    assert outputs[middle].text_delta == read[middle]  # resolved once, then a plain string


def test_deferred_text_read_on_other_threads_while_tokens_arrive(bundled):
    """AsyncEngine's shape: the step thread defers outputs, the event loop thread reads them (and
    here a second reader races it over every output)."""
    prompt_ids, output_ids = encode(bundled, PROMPT), encode(bundled, " ".join(TEXTS))
    arrived: queue.Queue[RequestOutput | None] = queue.Queue()
    read_in_order: list[str] = []
    racer_reads: list[str] = []
    made: list[RequestOutput] = []

    def produce():
        for output in deferred_outputs(bundled, prompt_ids, output_ids):
            made.append(output)
            arrived.put(output)
        arrived.put(None)

    def consume():
        while (output := arrived.get()) is not None:
            read_in_order.append(output.text_delta)

    def race():
        while len(made) < len(output_ids) or len(racer_reads) < len(output_ids):
            if len(racer_reads) < len(made):
                racer_reads.append(made[len(racer_reads)].text_delta)

    threads = [threading.Thread(target=target) for target in (produce, consume, race)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    expected = eager_deltas(bundled, prompt_ids, output_ids)
    assert read_in_order == expected
    assert racer_reads == expected


def test_outputs_dropped_unread_do_not_change_later_deltas(bundled):
    prompt_ids, output_ids = encode(bundled, PROMPT), encode(bundled, TEXTS[0] + TEXTS[2])
    outputs = deferred_outputs(bundled, prompt_ids, output_ids)
    kept = {index: output for index, output in enumerate(outputs) if index % 3 == 0}
    del outputs  # two thirds are garbage now, never read; their tokens must still be decoded in order
    expected = eager_deltas(bundled, prompt_ids, output_ids)
    assert {index: output.text_delta for index, output in kept.items()} == {index: expected[index] for index in kept}
