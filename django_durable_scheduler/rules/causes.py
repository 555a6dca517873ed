"""Why an occurrence exists when a chain or a batch made it (``Occurrence.cause``): what its
handler reads as ``ctx.predecessor`` or ``ctx.batch`` (docs/design.md, "Chains and batches").

Stored as JSON on the occurrence, so they are dicts; these types name their keys once, for the
kernel that writes them and the handlers that read them.
"""

from __future__ import annotations

from typing import Any, TypedDict, final


class _Followed(TypedDict):
    occurrence_id: str
    job_id: str
    status: str


# The optional keys in a class of their own (total=False) rather than as NotRequired[...]:
# under postponed annotations Python 3.11 cannot see NotRequired, and would call them required.
@final  # no other keys: a key of one tells the two apart
class Predecessor(_Followed, total=False):
    """The occurrence a follow-up (``then`` / ``on_dead_letter``) follows: its
    ``occurrence_id``, ``job_id`` and ``status`` (``succeeded`` or ``dead_letter``), with its
    ``result`` after a success and its ``error`` after a dead letter."""

    result: Any
    error: Any


@final
class BatchSummary(TypedDict):
    """The batch whose callback this is, once every member is terminal: ``counts`` are its
    members by final status (``succeeded``, ``dead_letter``, ``cancelled``), ``cancelled``
    whether the batch was cancelled. Its members' ids: ``scheduler.batch_members``."""

    batch_id: str
    description: str
    size: int
    counts: dict[str, int]
    cancelled: bool


Cause = Predecessor | BatchSummary
