"""Unique while pending, and debounce (``enqueue``'s ``unique_key``, ``unique_while`` and
``debounce``; docs/design.md, "Unique keys and debounce"): the waiting occurrence of a job and
key is returned (or debounced) instead of a second one being added, on every database, and
racing enqueuer processes never leave two waiting."""

from __future__ import annotations

import subprocess
import sys
import time
from collections import Counter, defaultdict
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

import django_durable_scheduler as scheduler
from django_durable_scheduler import kernel
from django_durable_scheduler.housekeeping.retention.plan import prune
from django_durable_scheduler.models import Event, Occurrence, OccurrenceStatus, UniqueCall, UniqueLock

from ..conftest import AUTHORITY, ROOT, snapshot, subprocess_env

JOB = "job-a"


def enqueue(clock, trigger_key: str, **options):
    return scheduler.enqueue(JOB, scheduled_for=clock(), trigger_key=trigger_key, **options)


def claim(owner: str = "w") -> Occurrence:
    row = kernel.claim(owner=owner, lease=60)
    assert row is not None
    return row


def waiting(key: str) -> list[Occurrence]:
    return list(Occurrence.objects.filter(unique_key=key, status__in=["queued", "retry_wait"]))


# --------------------------------------------------------------------------- unique


@pytest.mark.django_db
def test_unique_returns_the_waiting_occurrence_instead_of_adding_one(job, clock):
    first, deduplicated = enqueue(clock, "t1", unique_key="customer-42", payload={"n": 1})
    assert not deduplicated and first.unique_key == "customer-42"
    events = Event.objects.count()
    clock.advance(5)
    again, deduplicated = enqueue(clock, "t2", unique_key="customer-42", payload={"n": 2})
    assert deduplicated and again.pk == first.pk
    assert again.payload == {"n": 1}  # the waiting one wins; nothing is written
    assert Occurrence.objects.count() == 1 and Event.objects.count() == events
    other, deduplicated = enqueue(clock, "t3", unique_key="customer-43")
    assert not deduplicated and other.pk != first.pk
    plain, deduplicated = enqueue(clock, "t4")  # no key: as ever
    assert not deduplicated and plain.unique_key is None


@pytest.mark.django_db
def test_the_key_is_per_job(job, clock):
    scheduler.create_job("job-b", "reports.send", authority=AUTHORITY)
    a, _ = enqueue(clock, "t1", unique_key="k")
    b, deduplicated = scheduler.enqueue("job-b", scheduled_for=clock(), trigger_key="t1", unique_key="k")
    assert not deduplicated and b.pk != a.pk


@pytest.mark.django_db
def test_a_retry_waiting_occurrence_counts_as_waiting(job, clock):
    first, _ = enqueue(clock, "t1", unique_key="k")
    row = claim()
    scheduler.settle(row.pk, owner="w", fence=row.fence, outcome="failed", error="boom")
    assert Occurrence.objects.get(pk=first.pk).status == OccurrenceStatus.RETRY_WAIT
    again, deduplicated = enqueue(clock, "t2", unique_key="k")
    assert deduplicated and again.pk == first.pk and again.status == OccurrenceStatus.RETRY_WAIT


@pytest.mark.django_db
def test_pending_adds_one_while_the_first_runs_and_active_does_not(job, clock):
    first, _ = enqueue(clock, "t1", unique_key="k")
    running = claim()
    assert running.pk == first.pk
    held, deduplicated = enqueue(clock, "t2", unique_key="k", unique_while="active")
    assert deduplicated and held.pk == first.pk and held.status == OccurrenceStatus.RUNNING
    second, deduplicated = enqueue(clock, "t3", unique_key="k")  # "pending", the default
    assert not deduplicated and second.pk != first.pk
    third, deduplicated = enqueue(clock, "t4", unique_key="k", unique_while="pending")
    assert deduplicated and third.pk == second.pk
    # Once the first has run and the second is gone, a new one is added.
    scheduler.settle(running.pk, owner="w", fence=running.fence, outcome="succeeded")
    scheduler.cancel(second.pk, reason="not needed")
    fourth, deduplicated = enqueue(clock, "t5", unique_key="k", unique_while="active")
    assert not deduplicated and fourth.pk not in (first.pk, second.pk)


@pytest.mark.django_db
def test_the_slot_identity_still_comes_first(job, clock):
    """The same slot and trigger key again is the stored occurrence, key or no key, whatever
    its status; another payload for it is refused as always."""
    first, _ = enqueue(clock, "t1", unique_key="k", payload={"n": 1})
    row = claim()
    scheduler.settle(row.pk, owner="w", fence=row.fence, outcome="succeeded")
    again, deduplicated = scheduler.enqueue(
        JOB, scheduled_for=first.scheduled_for, trigger_key="t1", unique_key="k", payload={"n": 1}
    )
    assert deduplicated and again.pk == first.pk and again.status == OccurrenceStatus.SUCCEEDED
    before = snapshot()
    with pytest.raises(scheduler.IdempotencyPayloadMismatch):
        scheduler.enqueue(
            JOB,
            scheduled_for=first.scheduled_for,
            trigger_key="t1",
            unique_key="k",
            debounce=5,
            payload={"n": 2},
        )
    assert snapshot() == before
    # A plain enqueue of the slot a unique one stands for: the identity rule, no key needed.
    plain, deduplicated = scheduler.enqueue(
        JOB, scheduled_for=first.scheduled_for, trigger_key="t1", payload={"n": 1}
    )
    assert deduplicated and plain.pk == first.pk


@pytest.mark.django_db
def test_a_disabled_or_missing_job_is_refused_and_nothing_written(job, clock):
    enqueue(clock, "t1", unique_key="k")
    scheduler.update_job(JOB, expected_revision=1, enabled=False)
    before = snapshot(), list(UniqueLock.objects.values())
    with pytest.raises(scheduler.JobDisabled):
        enqueue(clock, "t2", unique_key="k")
    with pytest.raises(scheduler.JobDisabled):
        enqueue(clock, "t2", unique_key="k", debounce=5)
    with pytest.raises(scheduler.NotFound):
        scheduler.enqueue("nope", scheduled_for=clock(), trigger_key="t", unique_key="k")
    assert (snapshot(), list(UniqueLock.objects.values())) == before


@pytest.mark.django_db(transaction=True)
def test_inside_the_callers_transaction_it_exists_exactly_when_the_caller_commits(job, clock):
    with pytest.raises(RuntimeError), transaction.atomic():
        enqueue(clock, "t1", unique_key="k")
        raise RuntimeError("rolled back")
    assert not Occurrence.objects.exists()
    with transaction.atomic():
        kept, _ = enqueue(clock, "t2", unique_key="k")
        assert enqueue(clock, "t3", unique_key="k")[0].pk == kept.pk
    assert [o.pk for o in Occurrence.objects.all()] == [kept.pk]


# --------------------------------------------------------------------------- debounce


@pytest.mark.django_db
def test_debounce_moves_the_waiting_one_later_and_takes_the_newest_payload(job, clock):
    start = clock()
    first, deduplicated = enqueue(clock, "t1", unique_key="k", debounce=30, payload={"n": 1})
    assert not deduplicated and first.available_at == start + timedelta(seconds=30)
    clock.advance(10)
    last_event = Event.objects.order_by("-event_id").first().event_id
    moved, deduplicated = enqueue(
        clock, "t2", unique_key="k", debounce=timedelta(seconds=30), payload={"n": 2}
    )
    assert deduplicated and moved.pk == first.pk
    stored = Occurrence.objects.get(pk=first.pk)
    assert stored.payload == {"n": 2} and stored.available_at == start + timedelta(seconds=40)
    assert stored.status == OccurrenceStatus.QUEUED and stored.updated_at == clock()
    assert Occurrence.objects.count() == 1
    (event,) = Event.objects.filter(event_id__gt=last_event)
    assert event.event_type == "occurrence_debounced" and event.occurrence_id == first.pk
    assert event.data == {
        "uniqueKey": "k",
        "triggerKey": "t2",
        "previousAvailableAt": "2026-01-05T12:00:30.000Z",
        "availableAt": "2026-01-05T12:00:40.000Z",
        "status": "queued",
    }
    # Never earlier: a shorter debounce keeps the later start, and still takes the payload.
    enqueue(clock, "t3", unique_key="k", debounce=0, payload={"n": 3})
    stored.refresh_from_db()
    assert stored.available_at == start + timedelta(seconds=40) and stored.payload == {"n": 3}
    # No payload given: the job's, as for any enqueue.
    enqueue(clock, "t4", unique_key="k", debounce=1)
    stored.refresh_from_db()
    assert stored.payload == {"n": 1}
    # A debounced occurrence is claimed once due, with the newest payload.
    assert kernel.claim(owner="w", lease=60) is None
    clock.advance(31)
    assert claim().pk == first.pk


@pytest.mark.django_db
def test_debounce_keeps_a_retry_waiting_and_adds_one_while_the_first_runs(job, clock):
    first, _ = enqueue(clock, "t1", unique_key="k", debounce=0)
    row = claim()
    again, deduplicated = enqueue(clock, "t2", unique_key="k", debounce=5, payload={"n": 2})
    assert not deduplicated and again.pk != first.pk  # the running one has its payload already
    assert again.available_at == clock() + timedelta(seconds=5)
    scheduler.cancel(again.pk)
    scheduler.settle(
        row.pk,
        owner="w",
        fence=row.fence,
        outcome="failed",
        error="boom",
        retry_at=clock() + timedelta(hours=1),
    )
    moved, deduplicated = enqueue(clock, "t3", unique_key="k", debounce=5, payload={"n": 3})
    assert deduplicated and moved.pk == first.pk
    stored = Occurrence.objects.get(pk=first.pk)
    assert stored.status == OccurrenceStatus.RETRY_WAIT and stored.payload == {"n": 3}
    assert stored.available_at == clock() + timedelta(hours=1)  # the backoff is kept


@pytest.mark.django_db
def test_debounce_writes_exactly_the_lifecycle_columns(job, clock):
    enqueue(clock, "t1", unique_key="k", debounce=5)
    table = connection.ops.quote_name(Occurrence._meta.db_table)
    with CaptureQueriesContext(connection) as queries:
        enqueue(clock, "t2", unique_key="k", debounce=5, payload={"n": 2})
    updates = [q["sql"] for q in queries.captured_queries if q["sql"].startswith(f"UPDATE {table}")]
    assert len(updates) == 1
    assigned = updates[0].split(" SET ")[1].split(" WHERE ")[0]
    quote = connection.ops.quote_name
    assert {
        c for c in ("available_at", "payload", "updated_at", "status") if f"{quote(c)} = " in assigned
    } == {
        "available_at",
        "payload",
        "updated_at",
    }


# --------------------------------------------------------------------------- debounce_max_wait


@pytest.mark.django_db
def test_a_stream_of_debounced_calls_still_runs_by_its_cap(job, clock):
    """A call every 10 s with a 30 s debounce would postpone the run for ever; a 60 s cap holds
    its start at the first call plus 60 s, and it runs then with the newest payload."""
    first_call = clock()
    first, _ = enqueue(clock, "t0", unique_key="k", debounce=30, debounce_max_wait=60, payload={"n": 0})
    assert first.available_at == first_call + timedelta(seconds=30)
    starts = []
    for n in range(1, 6):
        clock.advance(10)
        cap = timedelta(minutes=1)
        moved, deduplicated = enqueue(
            clock, f"t{n}", unique_key="k", debounce=30, debounce_max_wait=cap, payload={"n": n}
        )
        assert deduplicated and moved.pk == first.pk
        starts.append(Occurrence.objects.get(pk=first.pk).available_at - first_call)
    assert starts == [timedelta(seconds=s) for s in (40, 50, 60, 60, 60)]
    event = Event.objects.filter(event_type="occurrence_debounced").order_by("-event_id").first()
    assert event.data["maxWaitUntil"] == "2026-01-05T12:01:00.000Z"
    clock.advance(10)  # first call + 60 s: due, although the calls kept coming
    row = claim()
    assert row.pk == first.pk and row.payload == {"n": 5}
    # Running, it is no longer waiting: the next call adds one, capped from its own first call.
    later, deduplicated = enqueue(clock, "t6", unique_key="k", debounce=30, debounce_max_wait=45)
    assert not deduplicated and later.available_at == clock() + timedelta(seconds=30)


@pytest.mark.django_db
def test_the_cap_never_moves_a_start_earlier(job, clock):
    first, _ = enqueue(clock, "t1", unique_key="k", debounce=30)  # no cap: due at +30 s
    clock.advance(20)
    enqueue(clock, "t2", unique_key="k", debounce=5, debounce_max_wait=5)
    assert Occurrence.objects.get(pk=first.pk).available_at == clock() + timedelta(seconds=10)


@pytest.mark.django_db
def test_retrying_a_capped_call_is_answered_as_it_was(job, clock):
    at = clock()
    first, _ = call(at, "a", {"n": 1}, debounce=30, debounce_max_wait=40)
    clock.advance(30)
    call(at, "b", {"n": 2}, debounce=30, debounce_max_wait=40)
    before = snapshot()
    clock.advance(5)
    again, deduplicated = call(at, "b", {"n": 2}, debounce=30, debounce_max_wait=40)
    assert deduplicated and again.pk == first.pk and snapshot() == before
    assert again.available_at == at + timedelta(seconds=40)


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"unique_key": "k", "debounce_max_wait": 60}, "debounce_max_wait"),
        ({"debounce": 5, "debounce_max_wait": 60}, "debounce"),
        ({"debounce_max_wait": 60}, "debounce_max_wait"),
        ({"unique_key": "k", "debounce": 30, "debounce_max_wait": 29}, "debounce_max_wait"),
        ({"unique_key": "k", "debounce": 30, "debounce_max_wait": -1}, "debounce_max_wait"),
        ({"unique_key": "k", "debounce": 30, "debounce_max_wait": "1m"}, "debounce_max_wait"),
        ({"unique_key": "k", "debounce": 30, "debounce_max_wait": 10**9}, "debounce_max_wait"),
    ],
)
def test_a_bad_debounce_max_wait_is_refused_naming_it_and_nothing_written(job, clock, options, field):
    before = snapshot()
    with pytest.raises(scheduler.InvalidArgument) as caught:
        enqueue(clock, "t1", **options)
    assert caught.value.details["field"] == field
    assert snapshot() == before


# --------------------------------------------------------------------------- the same call again


def call(clock_at, trigger_key: str, payload: dict, **options):
    """One keyed call, as a client would send it again: the same slot, trigger key, payload."""
    return scheduler.enqueue(
        JOB, scheduled_for=clock_at, trigger_key=trigger_key, payload=payload, unique_key="k", **options
    )


@pytest.mark.django_db
def test_retrying_the_call_that_added_a_debounced_occurrence_returns_it_untouched(job, clock):
    """(a) A added O, B debounced it: A again is A's own answer, compared with A's payload, not
    with the payload B gave O since; nothing is written."""
    at = clock()
    first, deduplicated = call(at, "a", {"n": 1}, debounce=30)
    assert not deduplicated
    clock.advance(10)
    moved, deduplicated = call(at, "b", {"n": 2}, debounce=30)
    assert deduplicated and moved.pk == first.pk
    clock.advance(10)
    before = snapshot()
    again, deduplicated = call(at, "a", {"n": 1}, debounce=30)
    assert deduplicated and again.pk == first.pk
    assert snapshot() == before
    stored = Occurrence.objects.get(pk=first.pk)
    assert stored.payload == {"n": 2} and stored.available_at == at + timedelta(seconds=40)
    # Plain unique calls too: the creator's own retry, and one that returned it.
    returned, _ = call(at, "c", {"n": 3})
    assert returned.pk == first.pk
    assert call(at, "c", {"n": 3}) == (stored, True) and snapshot() != before
    assert Occurrence.objects.get(pk=first.pk).payload == {"n": 2}


@pytest.mark.django_db
def test_retrying_the_debouncing_call_never_moves_the_start_twice(job, clock):
    """(b) B debounced O; B again returns O as it is: no second move, no second event."""
    at = clock()
    first, _ = call(at, "a", {"n": 1}, debounce=30)
    clock.advance(10)
    call(at, "b", {"n": 2}, debounce=30)
    debounced = Event.objects.filter(occurrence_id=first.pk, event_type="occurrence_debounced")
    assert debounced.count() == 1
    clock.advance(10)
    before = snapshot()
    for _ in range(3):
        again, deduplicated = call(at, "b", {"n": 2}, debounce=30)
        assert deduplicated and again.pk == first.pk
        assert again.available_at == at + timedelta(seconds=40)
    assert snapshot() == before and debounced.count() == 1
    # Another debounce value in the retry changes nothing: the call was answered.
    assert call(at, "b", {"n": 2}, debounce=600)[0].available_at == at + timedelta(seconds=40)
    assert snapshot() == before


@pytest.mark.django_db
def test_retrying_after_the_occurrence_ran_does_not_enqueue_the_work_again(job, clock):
    at = clock()
    first, _ = call(at, "a", {"n": 1}, debounce=0)
    call(at, "b", {"n": 2}, debounce=0)
    call(at, "c", {"n": 3})  # unique without debounce: returned the waiting one
    row = claim()
    scheduler.settle(row.pk, owner="w", fence=row.fence, outcome="succeeded")
    clock.advance(60)
    before = snapshot()
    for trigger_key, payload, options in (
        ("a", {"n": 1}, {"debounce": 0}),
        ("b", {"n": 2}, {"debounce": 0}),
        ("c", {"n": 3}, {}),
        ("c", {"n": 3}, {"unique_while": "active"}),
    ):
        again, deduplicated = call(at, trigger_key, payload, **options)
        assert deduplicated and again.pk == first.pk and again.status == OccurrenceStatus.SUCCEEDED
    assert snapshot() == before
    # A new call (its own trigger key) adds the next one, as before.
    fresh, deduplicated = call(at, "d", {"n": 4}, debounce=0)
    assert not deduplicated and fresh.pk != first.pk


@pytest.mark.django_db
def test_a_retry_with_another_payload_is_refused_and_writes_nothing(job, clock):
    at = clock()
    call(at, "a", {"n": 1}, debounce=30)
    call(at, "b", {"n": 2}, debounce=30)
    call(at, "c", {"n": 3})
    before = snapshot()
    for trigger_key, payload in (("a", {"n": 2}), ("b", {"n": 1}), ("b", {"n": 3}), ("c", {"n": 2})):
        with pytest.raises(scheduler.IdempotencyPayloadMismatch) as caught:
            call(at, trigger_key, payload, debounce=30)
        assert caught.value.code == "SCHEDULER_IDEMPOTENCY_PAYLOAD_MISMATCH"
        assert caught.value.details["trigger_key"] == trigger_key
    assert snapshot() == before


@pytest.mark.django_db
def test_each_keyed_call_is_recorded_once_and_plain_enqueues_record_none(job, clock):
    at = clock()
    first, _ = call(at, "a", {"n": 1}, debounce=30)
    call(at, "b", {"n": 2}, debounce=30)
    call(at, "b", {"n": 2}, debounce=30)
    call(at, "c", {"n": 3})
    scheduler.enqueue(JOB, scheduled_for=at, trigger_key="plain", payload={"n": 4})
    scheduler.enqueue_many(JOB, [{"scheduled_for": at, "trigger_key": "many"}])
    recorded = {row.call_key: row.occurrence_id for row in UniqueCall.objects.all()}
    keys = {o.trigger_key: o.idempotency_key for o in Occurrence.objects.all()}
    assert recorded[keys["a"]] == first.pk and len(recorded) == 3
    assert keys["plain"] not in recorded and keys["many"] not in recorded


@pytest.mark.django_db
def test_retention_deletes_the_records_with_their_occurrence(job, clock):
    at = clock()
    first, _ = call(at, "a", {"n": 1}, debounce=0)
    call(at, "b", {"n": 2}, debounce=0)
    row = claim()
    scheduler.settle(row.pk, owner="w", fence=row.fence, outcome="succeeded")
    waiting_one, _ = call(at, "c", {"n": 3}, debounce=60)  # a new one, still waiting
    clock.advance(days=2)
    dry = prune(timedelta(days=1), dry_run=True)
    assert (dry.occurrences, dry.unique_calls) == (1, 2) and UniqueCall.objects.count() == 3
    result = prune(timedelta(days=1), batch_size=1)
    assert (result.occurrences, result.unique_calls) == (1, 2)
    assert not Occurrence.objects.filter(pk=first.pk).exists()
    assert list(UniqueCall.objects.values_list("occurrence_id", flat=True)) == [waiting_one.pk]
    # Gone with its occurrence, a call is new again, as a pruned slot is for any enqueue.
    again, deduplicated = call(at, "b", {"n": 2}, debounce=0)
    assert again.pk == waiting_one.pk and deduplicated


# --------------------------------------------------------------------------- racing enqueuers

PROCESSES = 4


def race(mode: str, rounds: int, keys: int) -> list[list[str]]:
    scheduler.create_job("race", "reports.send", authority=AUTHORITY)
    env = subprocess_env(START_AT=str(time.time() + 2.0))
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.procs.unique_racer", mode, f"p{i}", str(rounds), str(keys)],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(PROCESSES)
    ]
    lines = []
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-3000:]
        lines += [line.split() for line in out.splitlines()]
    assert len(lines) == PROCESSES * rounds * keys
    return lines


def never_two_waiting() -> None:
    """Replayed from the events in the order they were written: no key ever had two
    occurrences waiting at once."""
    key_of = dict(Occurrence.objects.values_list("occurrence_id", "unique_key"))
    count: Counter[str] = Counter()
    for occurrence_id, event_type in (
        Event.objects.filter(occurrence__isnull=False)
        .order_by("event_id")
        .values_list("occurrence_id", "event_type")
    ):
        key = key_of[occurrence_id]
        if event_type == "occurrence_enqueued":
            count[key] += 1
            assert count[key] == 1, f"two occurrences of {key} waiting at once"
        elif event_type == "occurrence_claimed":
            count[key] -= 1


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("mode", ["unique", "active"])
def test_racing_unique_enqueuers_add_one_occurrence_per_key(mode):
    lines = race(mode, rounds=10, keys=3)
    for key in ("k0", "k1", "k2"):
        (row,) = Occurrence.objects.filter(job_id="race", unique_key=key)
        got = [(pk, flag) for k, pk, flag in lines if k == key]
        assert {pk for pk, _ in got} == {row.pk}
        assert sorted(flag for _, flag in got).count("0") == 1  # one enqueue added it
    assert Event.objects.filter(event_type="occurrence_enqueued").count() == 3
    never_two_waiting()


@pytest.mark.django_db(transaction=True)
def test_racing_debouncers_leave_one_occurrence_per_key_with_a_racers_last_payload():
    lines = race("debounce", rounds=10, keys=3)
    for key in ("k0", "k1", "k2"):
        (row,) = Occurrence.objects.filter(job_id="race", unique_key=key)
        assert {pk for k, pk, _ in lines if k == key} == {row.pk}
        assert row.payload["round"] == 9  # the newest write: some racer's last round
        debounced = Event.objects.filter(occurrence=row, event_type="occurrence_debounced").count()
        assert debounced == PROCESSES * 10 - 1
        # Never moved earlier: a racer that took the time before another but wrote after it
        # leaves the later start in place.
        latest = max(Event.objects.filter(occurrence=row).values_list("occurred_at", flat=True))
        assert row.available_at == latest + timedelta(seconds=60)
    never_two_waiting()


@pytest.mark.django_db(transaction=True)
def test_racing_retries_of_the_same_calls_debounce_once_per_call():
    """Every racer sends the same calls at once: each call adds or debounces once, whichever
    racer's copy comes first, and every copy gets that call's answer."""
    rounds = 10
    lines = race("retry", rounds=rounds, keys=3)
    for key in ("k0", "k1", "k2"):
        (row,) = Occurrence.objects.filter(job_id="race", unique_key=key)
        got = [(pk, flag) for k, pk, flag in lines if k == key]
        assert {pk for pk, _ in got} == {row.pk}
        assert [flag for _, flag in got].count("0") == 1  # one copy of the first call added it
        assert row.payload == {"by": "", "round": rounds - 1}
        debounced = Event.objects.filter(occurrence=row, event_type="occurrence_debounced")
        assert debounced.count() == rounds - 1  # once per later call, not per copy
        assert sorted(e.data["triggerKey"] for e in debounced) == sorted(
            f"-{r}-{key[1:]}" for r in range(1, rounds)
        )
    assert UniqueCall.objects.count() == 3 * rounds
    never_two_waiting()


@pytest.mark.django_db(transaction=True)
def test_racing_enqueuers_and_claimers_never_leave_two_waiting():
    """Each racer also claims and runs what is due: occurrences leave the waiting set while
    others are added, and still no key ever has two waiting."""
    lines = race("claim", rounds=15, keys=2)
    added = defaultdict(set)
    for key, pk, flag in lines:
        if flag == "0":
            added[key].add(pk)
    for key in ("k0", "k1"):
        assert len(waiting(key)) <= 1
        assert set(Occurrence.objects.filter(unique_key=key).values_list("pk", flat=True)) == added[key]
    never_two_waiting()
