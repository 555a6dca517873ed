"""The transition an occurrence write belongs to, named while its statements run.

Each kernel writer sends the statement that writes an action's columns inside
``with writing(action):``. The package does not read it back: it is there so that a check
installed on the connection (the test settings install one, docs/design.md, "Occurrence
lifecycle") can hold every UPDATE of the occurrence table against the columns the lifecycle
table gives that action. It costs two context-variable operations per statement.
"""

from __future__ import annotations

from contextvars import ContextVar, Token
from typing import Any

from ..rules.lifecycle import Action

# Per thread and per task, as a connection is: a worker's threads each write their own.
_WRITING: ContextVar[Action | None] = ContextVar("durable_scheduler_writing", default=None)


class writing:  # noqa: N801 (used as a context manager, like transaction.atomic)
    """Name ``action`` as the transition the statements inside the block write."""

    __slots__ = ("action", "token")

    def __init__(self, action: Action) -> None:
        self.action = action

    def __enter__(self) -> None:
        self.token: Token[Action | None] = _WRITING.set(self.action)

    def __exit__(self, *exc: Any) -> None:
        _WRITING.reset(self.token)


def announced() -> Action | None:
    """The action whose write is running in this context, if any."""
    return _WRITING.get()
