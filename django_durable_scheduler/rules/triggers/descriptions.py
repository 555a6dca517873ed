"""A trigger in words, for the admin and the task backend's previews."""

from __future__ import annotations

from typing import Any

from . import parse_instant, validate_trigger

__all__ = ["describe_trigger"]


def _plural(amount: int, unit: str) -> str:
    return f"every {unit}" if amount == 1 else f"every {amount} {unit}s"


def _describe_every(seconds: int) -> str:
    for size, unit in ((86_400, "day"), (3600, "hour"), (60, "minute")):
        if seconds % size == 0:
            return _plural(seconds // size, unit)
    return _plural(seconds, "second")


def _words_time(value: str) -> str:
    moment = parse_instant(value, "trigger")
    text = moment.strftime("%Y-%m-%d %H:%M")
    if moment.second or moment.microsecond:
        text = moment.strftime("%Y-%m-%d %H:%M:%S")
        if moment.microsecond:
            text += f".{moment.microsecond // 1000:03d}"
    return text + " UTC"


def describe_trigger(trigger: Any) -> str:
    """Short English for the admin, e.g. ``cron 0 9 * * 1-5 (Europe/Berlin)``.

    Other forms: ``every 5 minutes``, ``once at 2026-12-01 09:00 UTC``,
    ``no schedule (enqueue only)``; ``start_at``/``end_at`` add ``, from ...``/``, until ...``.
    The trigger is validated first.
    """
    spec = validate_trigger(trigger)
    if not spec:
        return "no schedule (enqueue only)"
    if "cron" in spec:
        text = f"cron {spec['cron']} ({spec['timezone']})"
    elif "every" in spec:
        text = _describe_every(spec["every"])
        if "anchor" in spec:
            text += f" from {_words_time(spec['anchor'])}"
    else:
        text = f"once at {_words_time(spec['at'])}"
    if "start_at" in spec:
        text += f", from {_words_time(spec['start_at'])}"
    if "end_at" in spec:
        text += f", until {_words_time(spec['end_at'])}"
    return text
