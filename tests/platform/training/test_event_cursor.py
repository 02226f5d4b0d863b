"""Issue 12 item 10: an `after` event cursor past 64 bits reached SQLite's driver (OverflowError, a 500);
it is a 400 naming `after`, like any other cursor that is not an event id."""
from __future__ import annotations

import pytest

from loraloom.platform.db.models import MAX_INT64
from loraloom.platform.training.errors import TrainingInputError
from loraloom.platform.training.jobs import parse_event_id


@pytest.mark.parametrize("number", [str(MAX_INT64 + 1), str(2**64), "9" * 100])
def test_an_event_cursor_past_64_bits_is_refused_naming_after(number):
    with pytest.raises(TrainingInputError) as refused:
        parse_event_id(f"ftevent-{number}")
    assert refused.value.param == "after" and "ftevent-<number>" in refused.value.message


def test_the_largest_event_id_is_a_cursor():
    assert parse_event_id(f"ftevent-{MAX_INT64}") == MAX_INT64
