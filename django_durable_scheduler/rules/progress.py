"""A running handler's progress (``ctx.report_progress``): how much of its work is done, out
of how much, with a short note, checked before anything is written, and how an operator
reads it (``done / total (pct%) note``). The kernel stores it in ``Occurrence.progress``
with the fence of the attempt that reported it (docs/design.md, "Progress")."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, TypeGuard

from ..exceptions import InvalidArgument
from .validation import MAX_SAFE_INTEGER, check_unicode, preview

MAX_NOTE_LENGTH = 200
_CONTROL = {chr(code) for code in (*range(0x20), 0x7F)}


@dataclass(frozen=True)
class Progress:
    """``done`` of ``total`` (None: not known), with ``note``; ``fence``: the attempt that
    reported it (0 until the kernel stores it)."""

    done: int | float
    total: int | float | None = None
    note: str | None = None
    fence: int = 0

    def as_json(self) -> dict[str, Any]:
        return {"done": self.done, "total": self.total, "note": self.note, "fence": self.fence}

    @classmethod
    def of_json(cls, value: Any) -> Progress | None:
        """The stored progress, or None for a value that is none (an older row's, a hand edit)."""
        if not isinstance(value, dict):
            return None
        done, total, note, fence = (value.get(key) for key in ("done", "total", "note", "fence"))
        if not _is_number(done) or not (total is None or _is_number(total)):
            return None
        note = note if isinstance(note, str) else None
        return cls(done, total, note, fence if isinstance(fence, int) else 0)

    @property
    def percent(self) -> int | None:
        """Whole per cent done (floored, so 100 only when all is done); None without a total."""
        if self.total is None or self.total <= 0:
            return None
        return min(100, math.floor(100 * self.done / self.total))

    def describe(self) -> str:
        """``done / total (pct%) note`` as an operator reads it, or ``done note`` without a total."""
        text = _number(self.done)
        if self.total is not None:
            text += f" / {_number(self.total)}"
            if self.percent is not None:
                text += f" ({self.percent}%)"
        return f"{text} {self.note}" if self.note else text


def _is_number(value: Any) -> TypeGuard[int | float]:
    if isinstance(value, float):
        return math.isfinite(value)
    return isinstance(value, int) and not isinstance(value, bool)


def _number(value: int | float) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def _count(value: Any, field: str) -> int | float:
    if not _is_number(value):
        kind = type(value).__name__
        raise InvalidArgument(
            field, f"must be a finite number (an int or a float), not {kind} {preview(value)}"
        )
    if value < 0:
        raise InvalidArgument(field, f"must be >= 0 (got {preview(value)})")
    if value > MAX_SAFE_INTEGER:
        raise InvalidArgument(field, f"must be <= {MAX_SAFE_INTEGER} (got {preview(value)})")
    return value


def normalize_note(value: Any) -> str | None:
    """A one-line note of at most MAX_NOTE_LENGTH characters (stripped; empty is none)."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidArgument("note", f"must be a string or None, not {type(value).__name__}")
    text = value.strip()
    if len(text) > MAX_NOTE_LENGTH:
        raise InvalidArgument("note", f"must be at most {MAX_NOTE_LENGTH} characters (got {len(text)})")
    check_unicode(text, "note")
    if any(char in _CONTROL for char in text):
        raise InvalidArgument("note", "must be one line, without control characters")
    return text or None


def normalize_progress(done: Any, total: Any = None, note: Any = None) -> Progress:
    """The progress checked: ``done`` and ``total`` finite numbers >= 0 with ``done <=
    total``, ``note`` short text. Bad input raises ``InvalidArgument`` naming the field."""
    done = _count(done, "done")
    if total is not None:
        total = _count(total, "total")
        if total < done:
            raise InvalidArgument("total", f"must be >= done ({_number(done)}), got {_number(total)}")
    return Progress(done, total, normalize_note(note))
