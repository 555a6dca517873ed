"""Chains: what an occurrence names to follow it, and the checks that keep a chain finite.

A follow-up is an occurrence of another job (with that job's principal), enqueued in the same
transaction as its predecessor's settle: ``then`` when the predecessor succeeds,
``on_dead_letter`` when it is dead-lettered (a cancelled one has none). A job declares the
follow-ups of all its occurrences (``create_job(then=...)``, ``@handler(job={"then": ...})``);
an enqueue adds its own (``enqueue(then=...)``), which may nest further steps. What settling
does with them is ``kernel/followups.py``'s, and the reads that check a declaration against
the stored jobs are ``kernel/chaining.py``'s; the semantics: docs/design.md, "Chains and batches".

A spec is a job id, or a dict ``{"job_id", "payload"?}`` (at enqueue also ``"then"`` and
``"on_dead_letter"``, for the follow-up's own follow-ups). Stored as
``{"then": [...], "on_dead_letter": [...]}`` with each entry a dict.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ..exceptions import InvalidArgument
from .identity import normalize_json
from .validation import key_label, normalize_identifier

EDGES = ("then", "on_dead_letter")
# What an occurrence's status at its terminal transition sends to: none for cancelled.
EDGE_OF_STATUS = {"succeeded": "then", "dead_letter": "on_dead_letter"}
MAX_FOLLOW_UPS = 100  # entries in one chain declaration, nested ones included
MAX_DEPTH = 16
_SPEC_KEYS = frozenset({"job_id", "payload", *EDGES})


def normalize_specs(value: Any, field: str, *, nested: bool = True) -> list[dict[str, Any]] | None:
    """``value`` (None, a job id, or a list of job ids and spec dicts) as stored: a list of
    spec dicts, or None when empty. ``nested``: specs may carry their own ``then`` and
    ``on_dead_letter`` (an enqueue's may; a job's name its follow-ups' jobs, which declare
    their own)."""
    counter = [0]
    specs = _specs(value, field, nested, 0, counter)
    return specs or None


def _specs(value: Any, field: str, nested: bool, depth: int, counter: list[int]) -> list[dict[str, Any]]:
    if value is None:
        return []
    if isinstance(value, str | Mapping):
        value = [value]
    if not isinstance(value, Iterable):
        raise InvalidArgument(field, "must be a job id, a dict naming job_id, or a list of them")
    if depth >= MAX_DEPTH:
        raise InvalidArgument(field, f"nests more than {MAX_DEPTH} steps")
    out = []
    for index, item in enumerate(value):
        label = f"{field}[{index}]"
        counter[0] += 1
        if counter[0] > MAX_FOLLOW_UPS:
            raise InvalidArgument(field, f"names more than {MAX_FOLLOW_UPS} follow-ups")
        out.append(_spec(item, label, nested, depth, counter))
    return out


def _spec(item: Any, label: str, nested: bool, depth: int, counter: list[int]) -> dict[str, Any]:
    if isinstance(item, str):
        return {"job_id": normalize_identifier(item, f"{label}")}
    if not isinstance(item, Mapping):
        raise InvalidArgument(label, f"must be a job id or a dict naming job_id, not {type(item).__name__}")
    allowed = _SPEC_KEYS if nested else frozenset({"job_id", "payload"})
    unknown = sorted(key_label(key) for key in item if key not in allowed)
    if unknown:
        hint = "" if nested else " (a job's follow-ups declare their own on their job)"
        raise InvalidArgument(f"{label}.{unknown[0]}", f"is not a follow-up attribute{hint}")
    if "job_id" not in item:
        raise InvalidArgument(f"{label}.job_id", "is required")
    spec: dict[str, Any] = {"job_id": normalize_identifier(item["job_id"], f"{label}.job_id")}
    if "payload" in item:
        spec["payload"] = normalize_json(item["payload"], f"{label}.payload")
    for edge in EDGES:
        if item.get(edge) is not None:
            inner = _specs(item[edge], f"{label}.{edge}", nested, depth + 1, counter)
            if inner:
                spec[edge] = inner
    return spec


def of_job(job: Any) -> dict[str, list[dict[str, Any]]]:
    """The follow-ups ``job`` (a ``Job`` row) declares for all its occurrences."""
    return {edge: getattr(job, edge) for edge in EDGES if getattr(job, edge)}


def merged(
    declared: Mapping[str, list[dict[str, Any]]], given: Mapping[str, Any] | None
) -> dict[str, list[dict[str, Any]]] | None:
    """An occurrence's follow-ups: its job's, then its enqueue's (None: it has none)."""
    out = {edge: [*declared.get(edge, ()), *((given or {}).get(edge) or ())] for edge in EDGES}
    return {edge: specs for edge, specs in out.items() if specs} or None


def jobs_named(follow_ups: Mapping[str, Any] | None) -> set[str]:
    """Every job id a chain declaration names, nested steps included."""
    found: set[str] = set()
    stack = [spec for edge in EDGES for spec in (follow_ups or {}).get(edge) or ()]
    while stack:
        spec = stack.pop()
        found.add(spec["job_id"])
        stack.extend(inner for edge in EDGES for inner in spec.get(edge) or ())
    return found
