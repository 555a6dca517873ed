"""The soak's audit (bench/soak.py): what must hold after a run under fire, each a check that
passes or fails with what it saw. :func:`audit` runs them all on the database Django is set
up with; the workers' samples and the run's figures come from the driver.

Every occurrence is terminal or waiting for a stated reason; none succeeded twice; each terminal
one has one terminal event, its success under its final fence; each schedule slot fired at most
once and every slot fired or was recorded skipped; every chain edge and every batch callback
exists exactly once; the budget ledger adds up in every window and no window spent past its
policy; the events rolled over into the next day's partition; the steady workers' memory and
connections stayed flat; no limit had more runs at once than it allows.
"""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from typing import Any

MEMORY_FACTOR = 1.25  # the last quarter's median resident set against the second quarter's
CONNECTIONS_PER_WORKER = 8  # loop, heartbeat, listener, retention, with room for handler threads
LIVE = ("queued", "running", "retry_wait")
TERMINAL_EVENTS = (
    "occurrence_succeeded",
    "occurrence_dead_lettered",
    "occurrence_cancelled",
    "authority_denied",
)
FIELDS = (
    "occurrence_id",
    "job_id",
    "status",
    "available_at",
    "attempt",
    "max_attempts",
    "fence",
    "result",
    "follow_ups",
    "caused_by",
    "trigger_key",
    "batch_id",
    "concurrency_key",
    "scheduled_for",
)


@dataclass
class Check:
    name: str
    ok: bool
    detail: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _sample(items: Any, limit: int = 5) -> str:
    items = list(items)
    more = f" (+{len(items) - limit} more)" if len(items) > limit else ""
    return ", ".join(str(i) for i in items[:limit]) + more


def audit(
    *,
    enqueued: set[str],
    stopped_at: datetime,
    midnight: datetime,
    workers: list[dict[str, Any]],
    figures: dict[str, Any],
    restarted: bool = True,
) -> list[Check]:
    """Every check, in order. ``stopped_at``: the clock when the workers were stopped (what was
    due before it should have run); ``midnight``: the day boundary the clock crossed."""
    from django_durable_scheduler.models import Occurrence

    rows = {r["occurrence_id"]: r for r in Occurrence.objects.values(*FIELDS).iterator(chunk_size=5000)}
    return [
        stored(enqueued, rows),
        settled_or_waiting(rows, stopped_at),
        *outcomes(rows),
        once_per_slot(rows),
        chain_edges(rows),
        batch_callbacks(rows),
        *budgets(rows),
        partitions_rolled_over(midnight),
        memory_flat(workers, figures),
        connections_flat(workers, figures),
        limits_held(figures),
        workers_stopped(workers),
        under_fire(figures, midnight, restarted),
    ]


def stored(enqueued: set[str], rows: dict[str, dict[str, Any]]) -> Check:
    missing = enqueued - rows.keys()
    return Check(
        "every occurrence an enqueue returned is stored",
        not missing,
        f"{len(enqueued)} returned, {len(missing)} missing" + (f": {_sample(missing)}" if missing else ""),
    )


def _last_events(ids: list[str]) -> dict[str, str]:
    from django_durable_scheduler.models import Event

    last: dict[str, str] = {}
    for occurrence_id, event_type in (
        Event.objects.filter(occurrence_id__in=ids)
        .order_by("event_id")
        .values_list("occurrence_id", "event_type")
    ):
        if event_type not in ("occurrence_renewed",):
            last[occurrence_id] = event_type
    return last


def _waiting_reason(row: dict[str, Any], last_event: str | None, stopped_at: datetime) -> str | None:
    """Why a live occurrence still waits, or None when it has no reason to."""
    if row["status"] == "running":
        return None
    if row["available_at"] > stopped_at:
        if last_event == "authority_deferred":
            return "budget exhausted: deferred to its window's end"
        if row["status"] == "retry_wait":
            return "retry_wait: its backoff ends after the stop"
        if last_event == "occurrence_debounced":
            return "debounced: due after the stop"
        return "enqueued to run later: due after the stop"
    return None


def settled_or_waiting(rows: dict[str, dict[str, Any]], stopped_at: datetime) -> Check:
    """Terminal, or waiting for a named reason. A due occurrence would be one waiting for a
    concurrency limit or a disabled job; the drain waits until no run holds a limit, and the
    soak disables no job, so one due at the stop has no reason."""
    statuses = Counter(r["status"] for r in rows.values())
    live = [pk for pk, r in rows.items() if r["status"] in LIVE]
    last = _last_events(live)
    reasons: Counter[str] = Counter()
    unexplained = []
    for pk in live:
        reason = _waiting_reason(rows[pk], last.get(pk), stopped_at)
        if reason is None:
            unexplained.append(f"{pk[:16]} ({rows[pk]['status']}, job {rows[pk]['job_id']})")
        else:
            reasons[reason] += 1
    detail = f"{len(rows)} occurrences: " + ", ".join(f"{s} {n}" for s, n in sorted(statuses.items()))
    if reasons:
        detail += "; waiting: " + "; ".join(f"{n} {why}" for why, n in sorted(reasons.items()))
    if unexplained:
        detail += (
            f"; {len(unexplained)} without a reason (running, or due at the stop): {_sample(unexplained)}"
        )
    return Check("every occurrence terminal or waiting for a stated reason", not unexplained, detail)


def outcomes(rows: dict[str, dict[str, Any]]) -> list[Check]:
    """At most one success per occurrence, and fencing: one terminal event per terminal
    occurrence (none for a live one), a success recorded under the final fence, a result
    returned by the attempt that held it."""
    from django_durable_scheduler.models import Event

    terminal: dict[str, list[tuple[str, int | None]]] = defaultdict(list)
    for pk, event_type, fence in Event.objects.filter(event_type__in=TERMINAL_EVENTS).values_list(
        "occurrence_id", "event_type", "fence"
    ):
        terminal[pk].append((event_type, fence))
    successes = {pk: [f for t, f in ev if t == "occurrence_succeeded"] for pk, ev in terminal.items()}
    twice = [pk for pk, fences in successes.items() if len(fences) > 1]
    wrong_status = [
        pk for pk, fences in successes.items() if fences and rows.get(pk, {}).get("status") != "succeeded"
    ]
    succeeded = [pk for pk, r in rows.items() if r["status"] == "succeeded"]
    unrecorded = [pk for pk in succeeded if not successes.get(pk)]
    one_success = Check(
        "no occurrence succeeded more than once",
        not (twice or wrong_status or unrecorded),
        f"{len(succeeded)} succeeded, each with one success event; {len(twice)} with more,"
        f" {len(wrong_status)} success events on occurrences not succeeded, {len(unrecorded)} without one"
        + (f": {_sample(twice + wrong_status + unrecorded)}" if twice or wrong_status or unrecorded else ""),
    )
    bad = []
    for pk, row in rows.items():
        events = terminal.get(pk, [])
        if row["status"] in LIVE:
            ok = not events
        else:
            ok = len(events) == 1
            if row["status"] == "succeeded" and ok:
                ok = events[0][1] == row["fence"] and _result_fence_matches(row)
        if not ok or row["attempt"] > row["max_attempts"]:
            bad.append(f"{pk[:16]} ({row['status']}, fence {row['fence']}, events {events})")
    fenced = Check(
        "fencing: one terminal event each, a success under the final fence",
        not bad,
        f"{len(rows)} occurrences, {sum(len(e) for e in terminal.values())} terminal events; {len(bad)} wrong"
        + (f": {_sample(bad, 3)}" if bad else ""),
    )
    return [one_success, fenced]


def _result_fence_matches(row: dict[str, Any]) -> bool:
    """A handler of the soak returns the fence it ran under: the stored result must be the
    final attempt's (a batch callback returns its batch instead)."""
    result = row["result"]
    return not (isinstance(result, dict) and "fence" in result) or result["fence"] == row["fence"]


def _expected_slots(job: Any) -> list[datetime]:
    from django_durable_scheduler import next_fire_times

    slots: list[datetime] = []
    after = job.created_at
    while job.last_slot_at is not None and after < job.last_slot_at:
        page = next_fire_times(job.trigger, after=after, count=1000, anchor=job.created_at)
        slots += [s for s in page if s <= job.last_slot_at]
        if len(page) < 1000:
            break
        after = page[-1]
    return slots


def once_per_slot(rows: dict[str, dict[str, Any]]) -> Check:
    """Each scheduled job's slots, from its first to its last: each fired once or was recorded
    skipped (a clock moved forward makes the missed ones one coalesced run)."""
    from bench.soak_load import SCHEDULED_JOBS
    from django_durable_scheduler.models import Event, Job

    problems, parts = [], []
    for job in Job.objects.filter(pk__in=SCHEDULED_JOBS).order_by("pk"):
        fired = Counter(
            r["scheduled_for"]
            for r in rows.values()
            if r["job_id"] == job.pk and r["trigger_key"].startswith("schedule:")
        )
        skips = list(
            Event.objects.filter(job_id=job.pk, event_type="slot_skipped").values_list("data", flat=True)
        )
        skipped = sum(d.get("count") or 0 for d in skips)
        expected = _expected_slots(job)
        if any(n > 1 for n in fired.values()):
            problems.append(f"{job.pk}: a slot fired twice")
        if set(fired) - set(expected):
            problems.append(f"{job.pk}: fired off its slots: {_sample(sorted(set(fired) - set(expected)))}")
        if len(fired) + skipped != len(expected) or any(d.get("count") is None for d in skips):
            problems.append(f"{job.pk}: {len(fired)} fired + {skipped} skipped != {len(expected)} slots")
        reasons = Counter(d.get("reason") for d in skips)
        parts.append(f"{job.pk} {len(expected)} slots: {len(fired)} fired, {skipped} skipped {dict(reasons)}")
    return Check(
        "each schedule slot fired at most once, none lost", not problems, "; ".join(problems or parts)
    )


def chain_edges(rows: dict[str, dict[str, Any]]) -> Check:
    """Each occurrence's follow-ups for the edge its end took (``then`` on success,
    ``on_dead_letter`` on a dead letter, none when cancelled or not ended) exist exactly once,
    and no follow-up exists that its predecessor's end did not call for."""
    from django_durable_scheduler.rules.chains import EDGE_OF_STATUS

    found: dict[str, Counter[str]] = defaultdict(Counter)
    for row in rows.values():
        if row["trigger_key"].startswith("after:"):
            found[row["caused_by"] or "?"][row["trigger_key"]] += 1
    bad, edges = [], Counter()
    for pk, row in rows.items():
        edge = EDGE_OF_STATUS.get(row["status"])
        specs = (row["follow_ups"] or {}).get(edge or "", []) if edge else []
        want = {f"after:{pk}:{edge}:{i}" for i in range(len(specs))}
        have = found.pop(pk, Counter())
        if set(have) != want or any(n != 1 for n in have.values()):
            bad.append(f"{pk[:16]} ({row['status']}): want {len(want)}, have {dict(have)}")
        edges.update({edge: len(want)} if want else {})
    bad += [f"follow-ups of a missing predecessor {pk}" for pk in found]
    return Check(
        "every chain edge followed exactly once",
        not bad,
        f"{sum(edges.values())} edges followed ({dict(edges)}); {len(bad)} wrong"
        + (f": {_sample(bad, 3)}" if bad else ""),
    )


def _batch_problems(
    batch: Any, members: list[dict[str, Any]], callbacks: Counter[str], events: Counter[str]
) -> list[str]:
    live = [m for m in members if m["status"] in LIVE]
    counts = Counter(m["status"] for m in members)
    key = batch.batch_id
    if batch.status != "completed":
        wrong = batch.status == "open" or not live or callbacks[key] or events[key]
        return [f"{key}: {batch.status} with {len(live)} live members"] if wrong else []
    problems = []
    if callbacks[key] != 1 or events[key] != 1:
        problems.append(f"{key}: {callbacks[key]} callbacks, {events[key]} batch_completed events")
    want = {s: counts.get(s, 0) for s in ("succeeded", "dead_letter", "cancelled")}
    if live or batch.counts != want or batch.size != len(members):
        problems.append(
            f"{key}: counts {batch.counts} against members {want}, size {batch.size}/{len(members)}"
        )
    return problems


def batch_callbacks(rows: dict[str, dict[str, Any]]) -> Check:
    """Every closed batch whose members all ended completed once, with one callback and one
    ``batch_completed`` event, its counts those of its members; none completed early."""
    from django_durable_scheduler.models import Batch, Event

    members: dict[str, list[dict[str, Any]]] = defaultdict(list)
    callbacks: Counter[str] = Counter()
    for row in rows.values():
        if row["batch_id"]:
            members[row["batch_id"]].append(row)
        if row["trigger_key"].startswith("batch:"):
            callbacks[row["trigger_key"].removeprefix("batch:")] += 1
    events = Counter(
        d.get("batchId")
        for d in Event.objects.filter(event_type="batch_completed").values_list("data", flat=True)
    )
    problems, statuses = [], Counter()
    for batch in Batch.objects.all():
        statuses[batch.status] += 1
        statuses["cancelled"] += batch.cancelled_at is not None
        problems += _batch_problems(batch, members.get(batch.batch_id, []), callbacks, events)
    return Check(
        "every batch callback exactly once",
        not problems,
        f"batches: {dict(statuses)}; {sum(callbacks.values())} callbacks; {len(problems)} wrong"
        + (f": {_sample(problems, 3)}" if problems else ""),
    )


def budgets(rows: dict[str, dict[str, Any]]) -> list[Check]:
    """The project's audit of the current windows, then every window recounted (the ones the
    clock's move ended too), none spent past its policy revision, and no reservation still
    open for an occurrence that ended."""
    from django.db.models import Count, Sum

    import django_durable_scheduler as scheduler
    from django_durable_scheduler.models import AuthorityPolicyRevision, AuthorityReservation, AuthorityUsage

    current = scheduler.audit_budgets()
    project = Check(
        "budget audit (audit_budgets) clean",
        all(c.matches for c in current),
        "; ".join(c.describe() for c in current) or "no window charged",
    )
    key = ("principal_type", "principal_id", "policy_revision", "window_started_at")
    counted = {
        tuple(r[k] for k in key): (r["n"], r["u"] or 0)
        for r in AuthorityReservation.objects.values(*key).annotate(n=Count("pk"), u=Sum("units")).order_by()
    }
    limits = {
        (r.principal_type, r.principal_id, r.revision): (r.content["max_runs"], r.content["max_units"])
        for r in AuthorityPolicyRevision.objects.all()
    }
    problems, at_limit, windows = [], 0, 0
    for usage in AuthorityUsage.objects.all():
        windows += 1
        window = tuple(getattr(usage, k) for k in key)
        seen = counted.pop(window, (0, 0))
        runs, units = limits[window[:3]]
        if (usage.runs, usage.units) != seen or usage.mismatch:
            problems.append(
                f"{window[1]} {window[3]:%H:%M}: usage {usage.runs}/{usage.units}, reservations {seen}"
            )
        if usage.runs > runs or usage.units > units:
            problems.append(f"{window[1]} {window[3]:%H:%M}: {usage.runs}/{usage.units} past {runs}/{units}")
        at_limit += usage.runs == runs or usage.units == units
    problems += [f"reservations without a usage row: {w}" for w in counted]
    open_ended = (
        AuthorityReservation.objects.filter(status="reserved").exclude(occurrence__status__in=LIVE).count()
    )
    if open_ended:
        problems.append(f"{open_ended} reservations still open for ended occurrences")
    ledger = Check(
        "every budget window adds up and stays within its policy",
        not problems,
        f"{windows} windows recounted, {at_limit} spent to their limit; {len(problems)} wrong"
        + (f": {_sample(problems, 3)}" if problems else ""),
    )
    return [project, ledger]


def partitions_rolled_over(midnight: datetime) -> Check:
    """Events before the boundary in the last day's partition, after it in the new day's, and
    none in the default partition (every day had its partition in time)."""
    from django.db import connection

    from django_durable_scheduler.housekeeping import partitions
    from django_durable_scheduler.models import Event

    if not partitions.is_partitioned("default"):
        return Check(
            "events rolled over into the next day's partition", False, "the events table is not partitioned"
        )
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT tableoid::regclass::text, count(*) FROM {Event._meta.db_table} GROUP BY 1")
        by_partition = dict(cursor.fetchall())
    before = partitions.partition_name(midnight - timedelta(days=1))
    after = partitions.partition_name(midnight)
    default = by_partition.get(partitions.default_name(), 0)
    ok = by_partition.get(before, 0) > 0 and by_partition.get(after, 0) > 0 and default == 0
    detail = ", ".join(f"{name} {n}" for name, n in sorted(by_partition.items()))
    return Check("events rolled over into the next day's partition", ok, detail)


def _quarters(samples: list[list[float]], window: list[float]) -> tuple[list[float], list[float]]:
    """The values sampled in the second and in the last quarter of the load."""
    start, end = window
    span = end - start
    second = [v for t, v in samples if start + span / 4 <= t < start + span / 2]
    last = [v for t, v in samples if start + 3 * span / 4 <= t <= end]
    return second, last


def memory_flat(workers: list[dict[str, Any]], figures: dict[str, Any]) -> Check:
    parts, ok = [], True
    for worker in (w for w in workers if w["steady"]):
        second, last = _quarters(worker["rss_kb"], figures["load_window"])
        if not second or not last:
            ok = False
            parts.append(f"{worker['worker_id']}: too few samples")
            continue
        a, b = statistics.median(second) / 1024, statistics.median(last) / 1024
        ok = ok and b <= MEMORY_FACTOR * a
        peak = max(v for _, v in worker["rss_kb"]) / 1024
        parts.append(f"{worker['worker_id']}: {a:.1f} -> {b:.1f} MB (x{b / a:.2f}, peak {peak:.1f})")
    return Check(
        f"steady workers' memory flat (last quarter's median within x{MEMORY_FACTOR} of the second's)",
        ok and bool(parts),
        "; ".join(parts) or "no steady worker",
    )


def connections_flat(workers: list[dict[str, Any]], figures: dict[str, Any]) -> Check:
    """Each process at most CONNECTIONS_PER_WORKER connections at any sample; the steady
    ones no more in the last quarter than in the second (one more allowed); none left after
    the workers stopped."""
    problems, parts = [], []
    peak = max((n for w in workers for _, n in w["connections"]), default=0)
    if peak > CONNECTIONS_PER_WORKER:
        problems.append(f"a worker held {peak} connections")
    for worker in (w for w in workers if w["steady"]):
        second, last = _quarters(worker["connections"], figures["load_window"])
        if not second or not last or max(last) > max(second) + 1:
            problems.append(f"{worker['worker_id']}: {second and max(second)} -> {last and max(last)}")
        parts.append(f"{worker['worker_id']} max {max(second, default=0):.0f} -> {max(last, default=0):.0f}")
    if figures["connections_left"]:
        problems.append(f"left after the stop: {figures['connections_left']}")
    return Check(
        f"connections bounded (<= {CONNECTIONS_PER_WORKER} a worker) and flat, none left",
        not problems,
        f"peak {peak} a worker; " + "; ".join(problems or parts),
    )


def limits_held(figures: dict[str, Any]) -> Check:
    from bench.soak_load import JOB_LIMIT, POLICIES
    from bench.soakapp.tasks import LIMITED_PER_CUSTOMER

    allowed = {"joblimit": JOB_LIMIT, "capped": POLICIES["soak-capped"][3]}
    seen = figures["limits_seen"]
    over = {k: n for k, n in seen.items() if n > allowed.get(k, LIMITED_PER_CUSTOMER)}
    return Check(
        "concurrency limits held at every sample (runs holding an unexpired lease)",
        not over and bool(seen),
        f"most seen at once: {seen}" + (f"; over: {over}" if over else ""),
    )


def workers_stopped(workers: list[dict[str, Any]]) -> Check:
    """Every process not killed (the steady ones through the restart and the clock's move)
    ran to the end and exited 0 on SIGTERM."""
    bad = [
        f"{w['worker_id']} exit {w['exit_code']}" for w in workers if not w["killed"] and w["exit_code"] != 0
    ]
    killed = sum(w["killed"] for w in workers)
    return Check(
        "every worker not killed ran to the end and stopped cleanly (exit 0)",
        not bad,
        f"{len(workers)} processes, {killed} SIGKILLed" + (f"; {_sample(bad)}" if bad else ""),
    )


def under_fire(figures: dict[str, Any], midnight: datetime, restarted: bool) -> Check:
    """The run met what it was meant to: kills, the server's restart, the clock past midnight."""
    jump = figures.get("clock_jump") or {}
    crossed = bool(jump) and datetime.fromisoformat(jump["from"]) < midnight <= datetime.fromisoformat(
        jump["to"]
    )
    ok = bool(figures["kills"]) and crossed and (not restarted or "pg_restart" in figures)
    return Check(
        "the run was under fire (kills, a server restart, the clock moved past midnight)",
        ok,
        f"{len(figures['kills'])} kills; restart {figures.get('pg_restart')};"
        f" clock {jump.get('from')} -> {jump.get('to')}",
    )


def print_report(result: dict[str, Any]) -> None:
    figures = result["figures"]
    print()
    for key in (
        "enqueue_calls",
        "enqueue_errors",
        "pg_restart",
        "clock_jump",
        "limits_seen",
        "left_at_load_end",
        "drain_seconds",
    ):
        print(f"  {key}: {figures.get(key)}")
    print(f"  kills: {len(figures['kills'])}; worker logs: {result['logs']}")
    print()
    for check in result["checks"]:
        print(f"{'PASS' if check['ok'] else 'FAIL'}  {check['name']}\n      {check['detail']}")
    failed = sum(not c["ok"] for c in result["checks"])
    print(f"\n{len(result['checks']) - failed} passed, {failed} failed")
