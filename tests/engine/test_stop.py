"""Stop strings over a stream of text deltas, and the per-token stop conditions."""
from __future__ import annotations

import pytest

from loraloom.engine.request import Request, RequestStatus, SamplingParams
from loraloom.engine.stop import StopStringMatcher, TokenStops


def run(stop: list[str], deltas: list[str]) -> tuple[list[str], bool]:
    """Feed deltas until a stop; returns what was emitted per call (flush included when not stopped)."""
    matcher = StopStringMatcher(stop)
    emitted = []
    for delta in deltas:
        text, stopped = matcher.feed(delta)
        emitted.append(text)
        if stopped:
            return emitted, True
    emitted.append(matcher.flush())
    return emitted, False


def reference(stop: list[str], text: str) -> tuple[str, bool]:
    """The whole-text answer: everything before the earliest stop string, or all of it."""
    starts = [text.find(s) for s in stop if s in text]
    return (text[: min(starts)], True) if starts else (text, False)


@pytest.mark.parametrize(
    "stop, deltas",
    [
        (["END"], ["Hello E", "N", "D and more"]),  # split across three deltas
        (["END"], ["ENDgame"]),  # stop at the very start
        (["END"], ["", "E", "ND"]),  # stop at the start, split
        (["abc", "bcd"], ["xab", "cd"]),  # overlapping candidates: the earlier start wins
        (["bcd", "abc"], ["xa", "bcd"]),  # order in the list does not matter
        (["aab"], ["a", "a", "a", "a", "b", "zz"]),  # partial matches restart inside the held text
        (["\n\n", "User:"], ["line one\n", "\nUser: hi"]),
        (["stop"], ["st", "o", "p"]),
        (["😀 bye"], ["ok 😀", " b", "ye now"]),
        (["END"], ["Hello E", "N", "d no match", " E"]),  # held text is released when the match fails
        (["END", "STOP"], ["nothing ", "to see ", "here"]),  # no false positives
        (["xyz"], ["x", "y", "x", "y", "z"]),
        ([], ["anything", " goes"]),
    ],
)
def test_stream_matches_the_whole_text_answer(stop, deltas):
    emitted, stopped = run(stop, deltas)
    assert ("".join(emitted), stopped) == reference(stop, "".join(deltas))


def test_text_that_cannot_start_a_stop_is_not_held_back():
    matcher = StopStringMatcher(["END"])
    assert matcher.feed("Hello E") == ("Hello ", False)  # "E" may start "END": held
    assert matcher.feed("x") == ("Ex", False)  # the match failed: released at once
    assert matcher.feed("EN") == ("", False)
    assert matcher.feed("!") == ("EN!", False)
    assert matcher.flush() == ""


def test_after_a_stop_everything_is_dropped():
    matcher = StopStringMatcher(["##"])
    assert matcher.feed("a#") == ("a", False)
    assert matcher.feed("#b") == ("", True)
    assert matcher.feed("more") == ("", True)
    assert matcher.flush() == ""


def test_held_text_comes_out_on_flush():
    matcher = StopStringMatcher(["</answer>"])
    assert matcher.feed("42 </ans") == ("42 ", False)
    assert matcher.flush() == "</ans"


def test_empty_stop_string_is_refused():
    with pytest.raises(ValueError, match="stop"):
        StopStringMatcher(["ok", ""])


def make_request(**params) -> Request:
    return Request(request_id="r", prompt_token_ids=[1, 2, 3], sampling_params=SamplingParams(**params))


def sample(request: Request, token_id: int, eos_token_ids: tuple[int, ...] = (0,)) -> str | None:
    request.output_token_ids.append(token_id)
    return TokenStops(request.sampling_params, eos_token_ids).check(token_id, len(request.output_token_ids))


def test_eos_stops_unless_ignored():
    assert sample(make_request(max_tokens=10), 0) == RequestStatus.FINISHED_STOPPED.value == "stop"
    assert sample(make_request(max_tokens=10), 9, eos_token_ids=(7, 9)) == "stop"
    assert sample(make_request(max_tokens=10, ignore_eos=True), 0) is None


def test_stop_token_ids_stop_even_with_ignore_eos():
    assert sample(make_request(max_tokens=10, stop_token_ids=[42], ignore_eos=True), 42) == "stop"
    assert sample(make_request(max_tokens=10, stop_token_ids=[42]), 41) is None


def test_max_tokens_gives_length_and_eos_on_the_last_token_gives_stop():
    request = make_request(max_tokens=3)
    assert [sample(request, t) for t in (5, 6, 7)] == [None, None, RequestStatus.FINISHED_LENGTH.value]
    request = make_request(max_tokens=2)
    assert [sample(request, t) for t in (5, 0)] == [None, "stop"]

