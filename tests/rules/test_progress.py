"""A progress report checked, and read as an operator reads it."""

from __future__ import annotations

import pytest

from django_durable_scheduler.exceptions import InvalidArgument
from django_durable_scheduler.rules.progress import MAX_NOTE_LENGTH, Progress, normalize_progress


@pytest.mark.parametrize(
    ("args", "text", "percent"),
    [
        ((40, 100, "rows"), "40 / 100 (40%) rows", 40),
        ((0, 7), "0 / 7 (0%)", 0),
        ((2, 3), "2 / 3 (66%)", 66),  # floored: 100% only when all is done
        ((999, 1000), "999 / 1000 (99%)", 99),
        ((5, 5, "done"), "5 / 5 (100%) done", 100),
        ((0.5, 2.0), "0.5 / 2 (25%)", 25),
        ((12,), "12", None),
        ((3, None, "pages"), "3 pages", None),
        ((0, 0), "0 / 0", None),
    ],
)
def test_described_as_done_of_total_with_percent_and_note(args, text, percent):
    progress = normalize_progress(*args)
    assert progress.describe() == text
    assert progress.percent == percent


def test_a_note_is_stripped_and_an_empty_one_is_none():
    assert normalize_progress(1, note="  step two ").note == "step two"
    assert normalize_progress(1, note="   ").note is None
    assert normalize_progress(1, note="n" * MAX_NOTE_LENGTH).note == "n" * MAX_NOTE_LENGTH


@pytest.mark.parametrize(
    ("args", "field", "says"),
    [
        ((-1,), "done", ">= 0"),
        (("3",), "done", "finite number"),
        ((None,), "done", "finite number"),
        ((False,), "done", "finite number"),
        ((float("inf"),), "done", "finite number"),
        ((2**60,), "done", "<="),
        ((5, 4), "total", ">= done"),
        ((1, float("nan")), "total", "finite number"),
        ((1, 2, b"note"), "note", "string"),
        ((1, 2, "n" * (MAX_NOTE_LENGTH + 1)), "note", "at most 200"),
        ((1, 2, "tab\there"), "note", "one line"),
    ],
)
def test_bad_input_names_the_field(args, field, says):
    with pytest.raises(InvalidArgument) as refused:
        normalize_progress(*args)
    assert refused.value.field == field
    assert says in str(refused.value)


def test_stored_json_reads_back_and_anything_else_reads_as_none():
    progress = Progress(3, 10, "x", fence=2)
    assert Progress.of_json(progress.as_json()) == progress
    for value in (None, [], {"done": "3"}, {"total": 3}, {"done": 1, "total": "a"}):
        assert Progress.of_json(value) is None
