"""Throttles: how fast a principal's, a job's or a kind's occurrences (per throttle key) may
start, held exactly by every claimer on every host (docs/design.md, "Throttles").

A throttle is a :class:`~.models.ThrottleBucket` row: the bucket as one instant (``tat``, the
rule in ``rules/throttles.py``) and the places handed to the work waiting for it
(``horizon``). A claim whose candidates have throttles locks their rows (sorted, after the
concurrency slots and before any occurrence) and starts a candidate only when every one of its
buckets has a token; one over the rate is given its own later start (``available_at``, the
``throttle`` row of the lifecycle table, no event, no attempt used) so it leaves the due rows
and the work of other keys is claimed meanwhile. A claim without throttled candidates sends
nothing more.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import connections

from ..db import guarded
from ..exceptions import InvalidArgument
from ..models import AuthorityPolicy, Occurrence, OccurrenceStatus, ThrottleBucket, ThrottlePlace
from ..rules import throttles as rule
from ..rules.authority import Principal
from ..rules.identity import scope_digest as bucket_id
from ..rules.lifecycle import Action
from ..rules.throttles import Throttle
from .transitions import writes
from .writing import writing

# The handlers' throttles by kind, registered with them (``@scheduler.handler(kind,
# throttle=...)``): kept here so that the claim and the enqueue read them without the registry.
_by_kind: dict[str, Throttle] = {}


def register_kind(kind: str, throttle: Throttle | None) -> None:
    if throttle is None:
        _by_kind.pop(kind, None)
    else:
        _by_kind[kind] = throttle


def forget_kind(kind: str) -> None:
    _by_kind.pop(kind, None)


def kind_throttle(kind: str) -> Throttle | None:
    return _by_kind.get(kind)


def throttled_kinds() -> Iterable[str]:
    """The kinds whose handler registered here has a throttle."""
    return _by_kind.keys()


def key_template(job_throttle: dict[str, Any] | None, kind: str) -> str | None:
    """The template of an occurrence's throttle key: its job's, else its handler's. It is
    checked against the payload at enqueue (a payload it cannot key is refused) and computed
    again at claim, from the payload, for the throttled candidates only."""
    if job_throttle is not None and job_throttle.get("key") is not None:
        return str(job_throttle["key"])
    throttle = _by_kind.get(kind)
    return None if throttle is None else throttle.key


def stored(value: Any) -> dict[str, Any] | None:
    """A job's or policy's throttle column as read by a raw statement (JSON text or a dict)."""
    if value is None or isinstance(value, dict):
        return value
    loaded: dict[str, Any] | None = json.loads(value)
    return loaded


def scopes_of(
    principal_key: str,
    job_id: str,
    kind: str,
    key: str | None,
    job_throttle: dict[str, Any] | None,
    principal_throttle: Throttle | None,
) -> list[tuple[list[str], Throttle]]:
    """Every throttle an occurrence is held to, as (scope, throttle). A key that cannot be
    computed from the payload (a template changed since the enqueue, or a handler's that the
    enqueuing process had not registered) counts under the throttle's whole scope (key ""):
    slower, never faster."""
    found: list[tuple[list[str], Throttle]] = []
    if principal_throttle is not None:
        found.append((["principal", principal_key], principal_throttle))
    if job_throttle is not None:
        found.append((["job", job_id, key or ""], Throttle.from_stored(job_throttle)))
    throttle = _by_kind.get(kind)
    if throttle is not None:
        found.append((["kind", kind, key or ""], throttle))
    return found


def policy_throttles(policies: Iterable[AuthorityPolicy]) -> dict[str, Throttle]:
    """The throttles of these policy rows, by principal key."""
    return {
        Principal.of_row(policy).key: Throttle.from_stored(policy.throttle)
        for policy in policies
        if policy.throttle is not None
    }


def gate_for(alias: str, now: datetime, pool: list[Any], by_principal: dict[str, Throttle]) -> Gate | None:
    """The throttles of a claim's ``pool`` (its candidates), their buckets locked; None when
    none has one. One read for the throttled candidates: their payloads (the key) and the
    places they were given."""
    throttled = {
        row.occurrence_id: row
        for row in pool
        if row.throttle is not None or row.principal_key in by_principal or row.kind in _by_kind
    }
    if not throttled:
        return None
    payloads = dict(
        Occurrence.objects.using(alias).filter(pk__in=sorted(throttled)).values_list("pk", "payload")
    )
    places = dict(
        ThrottlePlace.objects.using(alias).filter(pk__in=sorted(throttled)).values_list("pk", "slot")
    )
    found = {}
    for pk, row in throttled.items():
        job_throttle = stored(row.throttle)
        try:
            key = rule.render_key(key_template(job_throttle, row.kind), payloads.get(pk))
        except InvalidArgument:
            key = None
        found[pk] = scopes_of(
            row.principal_key, row.job_id, row.kind, key, job_throttle, by_principal.get(row.principal_key)
        )
    gate = Gate(alias, now, {pk: scopes for pk, scopes in found.items() if scopes}, places)
    gate.lock()
    return gate


@dataclass
class _Bucket:
    throttle: Throttle
    tat: datetime
    horizon: datetime
    changed: bool = False


@dataclass
class Gate:
    """The throttles of one claim's candidates: their bucket rows, locked, and what the claim
    took from them and placed behind them."""

    alias: str
    now: datetime
    throttles: dict[str, list[tuple[list[str], Throttle]]]
    places: dict[str, datetime] = field(default_factory=dict)  # the places given before, by id
    buckets: dict[str, _Bucket] = field(default_factory=dict)
    parked: list[Occurrence] = field(default_factory=list)
    started: list[str] = field(default_factory=list)  # admitted rows that held a place
    wake_at: datetime | None = None  # the earliest start this claim found or gave

    def lock(self) -> None:
        """Lock the bucket rows (those missing created first, then all locked in order, so
        two claims cannot wait on each other's rows in a cycle)."""
        scopes = {
            bucket_id(scope): (scope, throttle)
            for found in self.throttles.values()
            for scope, throttle in found
        }
        ids = sorted(scopes)
        existing = set(
            ThrottleBucket.objects.using(self.alias).filter(pk__in=ids).values_list("pk", flat=True)
        )
        missing = [key for key in ids if key not in existing]
        if missing:
            self._create(missing, scopes)
        rows = ThrottleBucket.objects.using(self.alias).filter(pk__in=ids)
        if connections[self.alias].features.has_select_for_update:  # SQLite holds its write lock
            rows = rows.select_for_update()  # waits: a claimer must never skip a bucket
        for row in rows.order_by("pk").only("pk", "tat", "horizon"):
            throttle = scopes[row.pk][1]
            self.buckets[row.pk] = _Bucket(throttle, rule.settled(row.tat, self.now, throttle), row.horizon)

    def _create(self, missing: list[str], scopes: dict[str, tuple[list[str], Throttle]]) -> None:
        tat, horizon = rule.fresh(self.now)
        rows = [
            ThrottleBucket(bucket_id=key, scope=scopes[key][0], tat=tat, horizon=horizon, updated_at=self.now)
            for key in missing
        ]
        guarded.insert_missing(self.alias, rows)

    def _of(self, occurrence: Occurrence) -> list[_Bucket] | None:
        """The buckets of ``occurrence`` (None: one is missing, which cannot happen: if it did,
        nothing of it starts)."""
        found = [self.buckets.get(bucket_id(scope)) for scope, _ in self.throttles.get(occurrence.pk, [])]
        return None if any(bucket is None for bucket in found) else [b for b in found if b is not None]

    def admit(self, occurrence: Occurrence, *, take: bool = True) -> bool:
        """Whether ``occurrence`` (locked, about to be claimed) may start now under every one
        of its throttles; with ``take``, it takes a token from each. One due at the place it
        was given holds it: the work placed behind it does not keep it waiting; other work
        waits behind what was placed before it (first come, first served)."""
        buckets = self._of(occurrence)
        if buckets is None:
            return False
        now = self.now
        holding = self.places.get(occurrence.pk) == occurrence.available_at
        for bucket in buckets:
            if not rule.allows(bucket.tat, now, bucket.throttle):
                return False
            if not holding and not rule.allows(bucket.horizon, now, bucket.throttle):
                return False
        if take:
            for bucket in buckets:
                bucket.tat = rule.take(bucket.tat, now, bucket.throttle)
                bucket.horizon = max(bucket.horizon, bucket.tat)
                bucket.changed = True
            if occurrence.pk in self.places:
                self.started.append(occurrence.pk)
        return True

    def park(self, occurrence: Occurrence) -> None:
        """Give ``occurrence``, over the rate, the next start its buckets have (after every
        place handed out before); a reclaim (running, its lease expired) stays as it is and
        is tried again when its bucket has a token."""
        buckets = self._of(occurrence)
        if not buckets:
            return
        if occurrence.status == OccurrenceStatus.RUNNING:
            free = max(rule.next_free(bucket.tat, bucket.throttle) for bucket in buckets)
            self._wake(free)
            return
        slot = max(
            max(rule.place(bucket.horizon, self.now, bucket.throttle) for bucket in buckets),
            rule.ceil_ms(max(rule.next_free(bucket.tat, bucket.throttle) for bucket in buckets)),
        )
        for bucket in buckets:
            bucket.horizon = rule.placed(bucket.horizon, slot, bucket.throttle)
            bucket.changed = True
        for name, value in writes(Action.THROTTLE, self.now, available_at=slot).items():
            setattr(occurrence, name, value)
        self.parked.append(occurrence)
        self._wake(slot)

    def _wake(self, at: datetime) -> None:
        self.wake_at = at if self.wake_at is None else min(self.wake_at, at)

    def save(self) -> None:
        """Write the buckets this claim changed and the places it gave (in the claim's
        transaction: a crash loses both, never one)."""
        rows = [
            ThrottleBucket(bucket_id=key, tat=bucket.tat, horizon=bucket.horizon, updated_at=self.now)
            for key, bucket in sorted(self.buckets.items())
            if bucket.changed
        ]
        if rows:
            ThrottleBucket.objects.using(self.alias).bulk_update(rows, ["tat", "horizon", "updated_at"])
        if self.parked:  # each row was given the table's values by park(): the same columns
            values = writes(Action.THROTTLE, self.now, available_at=self.now)
            with writing(Action.THROTTLE):
                Occurrence.objects.using(self.alias).bulk_update(self.parked, list(values))
            ids = [row.pk for row in self.parked]
            ThrottlePlace.objects.using(self.alias).filter(pk__in=ids).delete()
            ThrottlePlace.objects.using(self.alias).bulk_create(
                [ThrottlePlace(occurrence_id=row.pk, slot=row.available_at) for row in self.parked]
            )
        if self.started:  # a place is kept only while its occurrence waits for it
            ThrottlePlace.objects.using(self.alias).filter(pk__in=self.started).delete()
