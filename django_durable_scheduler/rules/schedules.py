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
- ``overlap: skip``: a slot does not fire while the job has an occurrence running, or one
  queued or waiting to retry that is scheduled before the slot (later work, say enqueued for
  tomorrow, does not block); within one pass only the first slot fires.

The slots that fire are always the latest due ones, and the skipped slots form at most three
contiguous ranges, each reported once with its reason and size. A usual pass lists its few due
slots; past ``MAX_CATCHUP_SLOTS`` of them the plan is found from the end
(``previous_fire_times``) and the rest counted (``count_fire_times``), so the work does not
depend on how long the scheduler was down, be it an hour or ten years of an every-second job.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from .triggers import DEFAULT_CATCHUP_WINDOW, MAX_CATCHUP_SLOTS
from .triggers.fire_times import count_fire_times, next_fire_time, next_fire_times, previous_fire_times
from .validation import iso_ms

MISFIRE_GRACE = timedelta(seconds=60)
_MS = timedelta(milliseconds=1)
_SKIP_REASONS = {"skip": "misfire_skip", "run_latest": "misfire_coalesced", "run_all": "catchup_limit"}


@dataclass(frozen=True)
class SkippedRange:
    """Consecutive slots of a job skipped for one reason, from ``first`` to ``last``.

    ``count`` is exact for ``every`` and ``at`` at any length. A cron's slots are counted by
    walking them (daylight saving defeats arithmetic), so a cron range of more than
    ``fire_times.MAX_COUNTED_SLOTS`` slots, such as a long outage's slots older than the
    catch-up window, has ``count`` ``None``: unknown, but more than that.
    """

    first: datetime
    last: datetime
    count: int | None
    reason: str

    def event_data(self) -> dict[str, Any]:
        """The ``slot_skipped`` event's data; ``slot`` (the first slot) predates the ranges."""
        return {
            "slot": iso_ms(self.first),
            "reason": self.reason,
            "from": iso_ms(self.first),
            "to": iso_ms(self.last),
            "count": self.count,
        }


@dataclass
class SlotPlan:
    fire: list[datetime] = field(default_factory=list)
    skipped: list[SkippedRange] = field(default_factory=list)
    next_fire_at: datetime | None = None
    last_slot_at: datetime | None = None


def initial_fire_time(trigger: dict[str, Any], *, now: datetime, anchor: datetime) -> datetime | None:
    """The first slot of a new or re-triggered job: strictly after now (an ``at`` still
    within the catch-up window counts, so that a one-off created a moment late runs)."""
    if not trigger:
        return None
    if "at" in trigger:
        return next_fire_time(trigger, after=now - catchup_window(trigger), anchor=anchor)
    return next_fire_time(trigger, after=now, anchor=anchor)


def expired_one_off(trigger: dict[str, Any], *, now: datetime) -> SkippedRange | None:
    """A one-off ``at`` that was already older than the catch-up window when the job was
    created or re-triggered: it never fires, and this is the skip to record for it."""
    if "at" not in trigger:
        return None
    at = datetime.fromisoformat(trigger["at"])
    if at > now - catchup_window(trigger) or not previous_fire_times(trigger, before=at + _MS, not_before=at):
        return None  # still due (initial_fire_time has it), or outside start_at/end_at
    return SkippedRange(at, at, 1, "outside_catchup_window")


def catchup_window(trigger: dict[str, Any]) -> timedelta:
    """How far back a missed slot may still fire (``catchup_window`` seconds, default 3600)."""
    return timedelta(seconds=trigger.get("catchup_window", DEFAULT_CATCHUP_WINDOW))


def _range(
    trigger: dict[str, Any], anchor: datetime, start: datetime | None, before: datetime, reason: str
) -> SkippedRange | None:
    """The slots from the slot ``start`` to the last one before ``before``, as one range."""
    if start is None or start >= before:
        return None
    last = previous_fire_times(trigger, before=before, anchor=anchor, not_before=start)[-1]
    count = count_fire_times(trigger, first=start, last=last, anchor=anchor)
    return SkippedRange(start, last, count, reason)


def plan_slots(
    trigger: dict[str, Any],
    *,
    next_fire_at: datetime,
    now: datetime,
    anchor: datetime,
    last_slot_at: datetime | None,
    running: bool = False,
    earliest_pending: datetime | None = None,
) -> SlotPlan:
    """What to do with the slots due from ``next_fire_at`` to ``now``.

    ``running`` (an occurrence of the job is running) and ``earliest_pending`` (when its
    earliest queued or retry_wait occurrence is scheduled) matter only to ``overlap: skip``.
    Slots at or before ``last_slot_at`` were materialized already, or come before one that
    was, and are left alone.
    """
    plan = SlotPlan()
    if next_fire_at > now:
        plan.next_fire_at = next_fire_at
        return plan
    first: datetime | None = next_fire_at
    if last_slot_at is not None and next_fire_at <= last_slot_at:
        first = next_fire_time(trigger, after=last_slot_at, anchor=anchor)
    if first is None or first > now:
        plan.next_fire_at = first
        return plan
    window_start = now - catchup_window(trigger)
    misfire = trigger.get("misfire", "run_latest")
    reason = _SKIP_REASONS[misfire]
    # The usual pass has a few due slots: one forward step finds them all and the next one.
    batch = [first, *next_fire_times(trigger, after=first, count=MAX_CATCHUP_SLOTS, anchor=anchor)]
    due = [slot for slot in batch if slot <= now]
    if len(due) < len(batch) or len(batch) <= MAX_CATCHUP_SLOTS:
        plan.next_fire_at = batch[len(due)] if len(due) < len(batch) else None
        late = [slot for slot in due if slot < window_start]
        tail = due[len(late) :][-MAX_CATCHUP_SLOTS:]
        fire = _choose(misfire, tail, now)
        ranges = [
            _listed(late, "outside_catchup_window"),
            _listed(due[len(late) : due.index(fire[0]) if fire else None], reason),
        ]
        plan.last_slot_at = due[-1] if due else None
    else:
        # Long outage: the slots that fire are the latest ones, found from the end; the rest
        # are counted, not listed.
        upto = now + _MS  # the due slots are those before this
        tail = previous_fire_times(
            trigger, before=upto, count=MAX_CATCHUP_SLOTS, anchor=anchor, not_before=max(first, window_start)
        )
        fire = _choose(misfire, tail, now)
        in_window = (
            first
            if first >= window_start
            else next_fire_time(trigger, after=window_start - _MS, anchor=anchor)
        )
        ranges = [
            _range(trigger, anchor, first, window_start, "outside_catchup_window"),
            _range(trigger, anchor, in_window, fire[0] if fire else upto, reason),
        ]
        plan.next_fire_at = next_fire_time(trigger, after=now, anchor=anchor)
        plan.last_slot_at = tail[-1] if tail else ranges[0].last if ranges[0] else None
    if trigger.get("overlap") == "skip" and fire:
        blocked = running or (earliest_pending is not None and earliest_pending < fire[0])
        allowed = [] if blocked else fire[:1]
        ranges.append(_listed(fire[len(allowed) :], "overlap"))
        fire = allowed
    plan.fire = fire
    plan.skipped = [skipped for skipped in ranges if skipped is not None]
    return plan


def _choose(misfire: str, tail: list[datetime], now: datetime) -> list[datetime]:
    """Which of the latest due slots within the catch-up window fire: always a suffix.

    ``tail`` holds all the on-time slots: slots are at least a second apart, so at most 61
    fit in the grace, fewer than MAX_CATCHUP_SLOTS.
    """
    on_time = [slot for slot in tail if now - slot <= MISFIRE_GRACE]
    if misfire == "skip":
        return on_time
    if misfire == "run_all":
        return tail
    return on_time or tail[-1:]


def _listed(slots: list[datetime], reason: str) -> SkippedRange | None:
    return SkippedRange(slots[0], slots[-1], len(slots), reason) if slots else None
