"""Which due slots of a job fire and which are skipped: the misfire and overlap rules.

Pure functions: the kernel (``kernel.materialize_due``) applies the plan in one
transaction together with the job's new next fire time.

A slot is *on time* when it is at most ``MISFIRE_GRACE`` late; later than that it was
*missed* (the scheduler was down or behind). ``catchup_window`` bounds how far back a
missed slot may still fire.

- ``skip``: on-time slots fire; missed ones are skipped.
- ``run_latest`` (default): on-time slots fire; of the missed ones, only the latest fires,
  and only when no on-time slot does (the others are coalesced into it).
- ``run_all``: every slot within the catch-up window fires, at most the 100 latest.
- ``overlap: skip``: while an earlier occurrence of the job is queued, running or waiting
  to retry, no slot fires; within one pass only the first fires.

Every slot that does not fire is reported with its reason.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from .triggers import DEFAULT_CATCHUP_WINDOW, MAX_CATCHUP_SLOTS, next_fire_time, next_fire_times

MISFIRE_GRACE = timedelta(seconds=60)
# At most this many due slots are looked at in one pass; beyond it (say an every-second
# job after a long outage) the rest are skipped in bulk and counted.
MAX_SLOT_SCAN = 5000
_BATCH = 1000


@dataclass
class SlotPlan:
    fire: list[datetime] = field(default_factory=list)
    skipped: list[tuple[datetime, str]] = field(default_factory=list)
    # Slots skipped without being enumerated (the scan limit): (after, until).
    bulk_skipped: tuple[datetime, datetime] | None = None
    next_fire_at: datetime | None = None
    last_slot_at: datetime | None = None


def initial_fire_time(trigger: dict[str, Any], *, now: datetime, anchor: datetime) -> datetime | None:
    """The first slot of a new or re-triggered job: strictly after now (an ``at`` still
    within the catch-up window counts, so that a one-off created a moment late runs)."""
    if not trigger:
        return None
    if "at" in trigger:
        window = timedelta(seconds=trigger.get("catchup_window", DEFAULT_CATCHUP_WINDOW))
        return next_fire_time(trigger, after=now - window, anchor=anchor)
    return next_fire_time(trigger, after=now, anchor=anchor)


def _due_slots(
    trigger: dict[str, Any], first: datetime, now: datetime, anchor: datetime
) -> tuple[list[datetime], datetime | None, bool]:
    """Slots from ``first`` up to ``now``; the next slot after them; whether truncated."""
    due = [first]
    while len(due) < MAX_SLOT_SCAN:
        batch = next_fire_times(trigger, after=due[-1], count=_BATCH, anchor=anchor)
        for slot in batch:
            if slot > now:
                return due, slot, False
            due.append(slot)
        if len(batch) < _BATCH:
            return due, None, False
    return due, None, True


def plan_slots(
    trigger: dict[str, Any],
    *,
    next_fire_at: datetime,
    now: datetime,
    anchor: datetime,
    last_slot_at: datetime | None,
    overlap_active: bool,
) -> SlotPlan:
    plan = SlotPlan()
    if next_fire_at > now:
        plan.next_fire_at = next_fire_at
        return plan
    due, following, truncated = _due_slots(trigger, next_fire_at, now, anchor)
    plan.last_slot_at = due[-1]
    if truncated:
        following = next_fire_time(trigger, after=now, anchor=anchor)
        plan.bulk_skipped = (due[-1], now)
        plan.last_slot_at = now
    plan.next_fire_at = following
    # Never fire a slot at or before the last one ever materialized (edits, clock changes).
    fresh = [slot for slot in due if last_slot_at is None or slot > last_slot_at]
    window_start = now - timedelta(seconds=trigger.get("catchup_window", DEFAULT_CATCHUP_WINDOW))
    misfire = trigger.get("misfire", "run_latest")
    eligible: list[datetime] = []
    for slot in fresh:
        if slot < window_start:
            plan.skipped.append((slot, "outside_catchup_window"))
        else:
            eligible.append(slot)
    on_time = [slot for slot in eligible if now - slot <= MISFIRE_GRACE]
    late = [slot for slot in eligible if now - slot > MISFIRE_GRACE]
    if misfire == "skip":
        fire = on_time
        plan.skipped += [(slot, "misfire_skip") for slot in late]
    elif misfire == "run_all":
        fire = eligible[-MAX_CATCHUP_SLOTS:]
        plan.skipped += [(slot, "catchup_limit") for slot in eligible[:-MAX_CATCHUP_SLOTS]]
    else:
        keep = [] if on_time or not late else [late[-1]]
        fire = keep + on_time
        plan.skipped += [(slot, "misfire_coalesced") for slot in late if slot not in keep]
    if trigger.get("overlap") == "skip" and fire:
        allowed = [] if overlap_active else fire[:1]
        plan.skipped += [(slot, "overlap") for slot in fire if slot not in allowed]
        fire = allowed
    plan.fire = fire
    plan.skipped.sort()
    return plan
