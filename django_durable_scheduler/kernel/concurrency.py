"""Concurrency limits: how many of a principal's, a job's or a kind's occurrences (per
concurrency key) run at once, held exactly by every claimer on every host
(docs/design.md, "Concurrency limits").

A limit is a :class:`~.models.ConcurrencySlot` row listing the claims it admitted. A claim
whose candidates have limits locks their rows (sorted, after the policy rows and before any
occurrence), keeps the holders still running on their fence with an unexpired lease, and
admits a candidate only while every one of its limits has a free place. A claim without
limited candidates sends nothing more.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from django.db import connections
from django.db.models import Q

from ..db import dialect, guarded
from ..exceptions import InvalidArgument
from ..models import AuthorityPolicy, ConcurrencySlot, Occurrence, OccurrenceStatus
from ..rules.authority import Principal
from ..rules.identity import scope_digest as slot_id
from ..rules.validation import MAX_KEY_LENGTH, normalize_template

# The key of a limit: a function of the payload, or a template naming payload fields.
KeySpec = str | Callable[[Any], Any]


def normalize_key_spec(value: Any, field: str) -> KeySpec | None:
    """A handler's key: a template (:func:`normalize_template`) or a function of the payload."""
    if callable(value):
        function: Callable[[Any], Any] = value
        return function
    return normalize_template(value, field)


def render_key(spec: KeySpec | None, payload: Any) -> str | None:
    """The concurrency key of an occurrence with ``payload``; a bad one is refused at enqueue."""
    if spec is None:
        return None
    try:
        if callable(spec):
            key = spec(payload)
        else:
            key = spec.format_map(payload if isinstance(payload, dict) else {})
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
        raise InvalidArgument("concurrency_key", f"cannot be computed from the payload ({exc!r})") from None
    if key is None:
        return None
    if isinstance(key, bool) or not isinstance(key, str | int):
        raise InvalidArgument("concurrency_key", "must compute a string (or an int)")
    key = str(key)
    if not key or len(key) > MAX_KEY_LENGTH or "\x00" in key:
        raise InvalidArgument("concurrency_key", f"must compute 1..{MAX_KEY_LENGTH} characters, without NUL")
    return key


# The handlers' limits by kind, registered with them (``@scheduler.handler(kind,
# concurrency=...)``): kept here so that the claim and the enqueue can read them without
# importing the handler registry.
_by_kind: dict[str, tuple[int | None, KeySpec | None]] = {}


# The kinds with a limit: a claim none of whose candidates is of one of them (and whose
# jobs and principals have none) skips the gate.
_limited_kinds: frozenset[str] = frozenset()


def register_kind(kind: str, limit: int | None, key: KeySpec | None) -> None:
    if limit is None and key is None:
        _by_kind.pop(kind, None)
    else:
        _by_kind[kind] = (limit, key)
    _limits_changed()


def forget_kind(kind: str) -> None:
    _by_kind.pop(kind, None)
    _limits_changed()


def _limits_changed() -> None:
    global _limited_kinds
    _limited_kinds = frozenset(kind for kind, (limit, _) in _by_kind.items() if limit is not None)


def limited_kinds() -> frozenset[str]:
    """The kinds whose handler registered here has a limit."""
    return _limited_kinds


def kind_limit(kind: str) -> int | None:
    return _by_kind.get(kind, (None, None))[0]


def key_spec_of(job_key: str | None, kind: str) -> KeySpec | None:
    """The key an occurrence is given: its job's template, else its handler's."""
    return job_key if job_key is not None else _by_kind.get(kind, (None, None))[1]


def scopes_of(
    principal_key: str,
    job_id: str,
    kind: str,
    key: str | None,
    job_limit: int | None,
    max_running: int | None,
) -> list[tuple[list[str], int]]:
    """Every limit an occurrence is held to, as (scope, limit)."""
    found: list[tuple[list[str], int]] = []
    if max_running is not None:
        found.append((["principal", principal_key], max_running))
    if job_limit is not None:
        found.append((["job", job_id, key or ""], job_limit))
    limit = kind_limit(kind)
    if limit is not None:
        found.append((["kind", kind, key or ""], limit))
    return found


class Gate:
    """The limits of one claim's candidates: their slot rows, locked, and what is free."""

    def __init__(self, alias: str, now: datetime, limits: dict[str, list[tuple[list[str], int]]]) -> None:
        self.alias = alias
        self.now = now
        self.limits = {
            pk: [(slot_id(scope), limit) for scope, limit in found] for pk, found in limits.items()
        }
        self.scopes = {slot_id(scope): scope for found in limits.values() for scope, _ in found}
        self.holders: dict[str, list[list[Any]]] = {}
        self.changed: set[str] = set()
        self.unseen: set[str] = set()

    def lock(self) -> None:
        """Lock the slot rows (those missing created first, then all locked in order, so two
        claims cannot wait on each other's rows in a cycle) and keep their live holders."""
        ids = sorted(self.scopes)
        existing = set(
            ConcurrencySlot.objects.using(self.alias).filter(pk__in=ids).values_list("pk", flat=True)
        )
        missing = [key for key in ids if key not in existing]
        if missing:
            self._create(missing)
        rows = ConcurrencySlot.objects.using(self.alias).filter(pk__in=ids)
        if connections[self.alias].features.has_select_for_update:  # SQLite holds its write lock
            rows = rows.select_for_update()  # waits: a claimer must never skip a limit's row
        for row in rows.order_by("pk").only("pk", "holders"):
            self.holders[row.pk] = [list(holder) for holder in row.holders or []]
        self.unseen = set(ids) - set(self.holders)  # cannot happen; if it did: admit nothing
        state = self._state({holder[0] for found in self.holders.values() for holder in found})
        for key, found in self.holders.items():
            kept = [holder for holder in found if _holds(holder, state)]
            if len(kept) != len(found):
                self.holders[key] = kept
                self.changed.add(key)

    def _create(self, missing: list[str]) -> None:
        rows = [
            ConcurrencySlot(slot_id=key, scope=self.scopes[key], holders=[], updated_at=self.now)
            for key in missing
        ]
        guarded.insert_missing(self.alias, rows)

    def _state(self, ids: set[str]) -> dict[str, tuple[int, bool]]:
        """Each holder occurrence's fence, and whether it runs on it with an unexpired lease."""
        if not ids:
            return {}
        # Read as last committed: a holder claimed after this transaction's first read must
        # be seen (MySQL), or its place would look free.
        rows = dialect.latest_rows(
            Occurrence.objects.using(self.alias).filter(pk__in=sorted(ids)), self.alias
        )
        return {
            pk: (fence, status == OccurrenceStatus.RUNNING and expires is not None and expires > self.now)
            for pk, fence, status, expires in rows.values_list("pk", "fence", "status", "lease_expires_at")
        }

    def admit(self, occurrence: Occurrence) -> bool:
        """Whether ``occurrence`` (locked, about to be claimed) fits every one of its limits;
        if so it takes a place in each, as the holder of the fence its claim gives it."""
        limits = self.limits.get(occurrence.pk, [])
        if any(key in self.unseen or len(self.holders.get(key, [])) >= limit for key, limit in limits):
            return False
        for key, _ in limits:
            self.holders.setdefault(key, []).append([occurrence.pk, occurrence.fence + 1])
            self.changed.add(key)
        return True

    def save(self) -> None:
        """Write the holders of the slots this claim changed (in the claim's transaction)."""
        rows = [
            ConcurrencySlot(slot_id=key, holders=self.holders[key], updated_at=self.now)
            for key in sorted(self.changed)
        ]
        if rows:
            ConcurrencySlot.objects.using(self.alias).bulk_update(rows, ["holders", "updated_at"])


def _holds(holder: list[Any], state: dict[str, tuple[int, bool]]) -> bool:
    """Whether a holder ``[occurrence_id, fence]`` still holds its place: its row runs on that
    fence with an unexpired lease, or the row read is older than the claim that added the
    holder (never, as ``_state`` reads; if it were: counted, never wrongly freed). A row gone,
    settled, expired or claimed again (a later fence) has given its place back."""
    if holder[0] not in state:
        return False
    fence, running = state[holder[0]]
    return fence < int(holder[1]) or (fence == int(holder[1]) and running)


def max_running_of(principal_keys: list[str], alias: str) -> dict[str, int]:
    """The principals' ``max_running`` where set, read (not locked): what a claim outside the
    worker, which locks no policy, holds them to."""
    match = Q()
    for key in principal_keys:
        principal = Principal.from_key(key)
        if principal is not None:
            match |= Q(**principal.columns())
    rows = AuthorityPolicy.objects.using(alias).filter(match, max_running__isnull=False)
    return {
        Principal.of_row(policy).key: policy.max_running
        for policy in rows.only("principal_type", "principal_id", "max_running")
        if policy.max_running is not None
    }
