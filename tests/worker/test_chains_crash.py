"""Chains and batches with real ``runscheduler`` processes SIGKILLed at random moments: each
predecessor that ends gets exactly one follow-up for its outcome, each batch exactly one
callback, however the kills fall (mid-handler, between a member's commit and its look for the
batch's completion, during start-up). A large batch drained by three processes completes once."""

from __future__ import annotations

import os
import random
import signal
import time
from collections import Counter

import pytest
from django.db import transaction

import django_durable_scheduler as scheduler
from django_durable_scheduler.models import Batch, Event, Occurrence, WorkerHeartbeat

from ..procs.runner import Worker, Workers, granted, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

BASE_MS = 1_700_000_000_000
TERMINAL = ("succeeded", "dead_letter", "cancelled")
LIVE = ("queued", "running", "retry_wait")
TERMINAL_EVENTS = ("occurrence_succeeded", "occurrence_dead_lettered", "occurrence_cancelled")
CLAIM_EVENTS = ("occurrence_claimed", "occurrence_reclaimed")


@pytest.fixture
def workers(tmp_path):
    spawned = Workers(tmp_path)
    yield spawned
    spawned.cleanup()


class Fleet:
    """``size`` runscheduler processes with a short lease (a killed worker's work comes back
    within a second or two); a killed one is replaced at once, as a supervisor would."""

    def __init__(
        self, workers: Workers, size: int, rng: random.Random, *, concurrency: int = 4, lease: float = 1
    ) -> None:
        self.workers, self.rng, self.concurrency, self.lease = workers, rng, concurrency, lease
        self.started = 0
        self.kills: list[str] = []
        self.orphaned = 0  # running occurrences the killed workers left behind
        self.live: dict[str, Worker] = {}
        for _ in range(size):
            self._start()

    def _start(self) -> None:
        name = f"w{self.started}"
        self.started += 1
        self.live[name] = self.workers.start(
            "--worker-id",
            name,
            "--lease",
            str(self.lease),
            "--concurrency",
            str(self.concurrency),
            verbosity=0,
        )

    def wait_ready(self) -> None:
        """Every live worker is in its loop (has written its heartbeat)."""
        names = set(self.live)

        def ready() -> bool:
            found = WorkerHeartbeat.objects.filter(worker_id__in=names).values_list("worker_id", flat=True)
            return set(found) == names

        assert wait_for(ready, 90), self.outputs()

    def kill(self, name: str | None = None) -> str:
        """SIGKILL the worker ``name`` (default: one at random among those holding leases, so
        that the kill interrupts something, else any) and start its replacement."""
        if name is None:
            holding = set(
                Occurrence.objects.filter(status="running", lease_owner__in=list(self.live)).values_list(
                    "lease_owner", flat=True
                )
            )
            name = self.rng.choice(sorted(holding or self.live))
        victim = self.live.pop(name)
        os.kill(victim.pid, signal.SIGKILL)
        assert victim.wait(30) == -signal.SIGKILL
        self.kills.append(name)
        # What the dead worker held stays running until its lease expires.
        self.orphaned += Occurrence.objects.filter(status="running", lease_owner=name).count()
        self._start()
        return name

    def stop(self) -> None:
        """SIGTERM every live worker once it is in its loop (a replacement still starting up
        would die of the signal rather than stop), and check that each stopped cleanly."""
        self.wait_ready()
        for worker in self.live.values():
            worker.proc.send_signal(signal.SIGTERM)
        for worker in self.live.values():
            assert worker.wait(60) == 0, worker.output()

    def outputs(self) -> str:
        return "\n".join(f"--- {name}\n{worker.output(2000)}" for name, worker in self.live.items())


def kill_at_random(fleet: Fleet, kills: int, spacing: tuple[float, float]) -> None:
    """``kills`` SIGKILLs of random workers, each a random time after the one before."""
    for _ in range(kills):
        time.sleep(fleet.rng.uniform(*spacing))
        fleet.kill()


def assert_ended_once(ids) -> dict[str, Occurrence]:
    """Each occurrence of ``ids`` is terminal, with exactly one terminal event (none ended
    twice), no lease left, and no more attempts than claims."""
    rows = {o.pk: o for o in Occurrence.objects.filter(pk__in=ids)}
    assert len(rows) == len(set(ids)), "an occurrence disappeared"
    assert {o.status for o in rows.values()} <= set(TERMINAL), Counter(o.status for o in rows.values())
    ended = Counter(
        Event.objects.filter(occurrence_id__in=ids, event_type__in=TERMINAL_EVENTS).values_list(
            "occurrence_id", flat=True
        )
    )
    assert set(ended) == set(rows), set(rows) - set(ended)
    assert max(ended.values()) == 1, [pk for pk, n in ended.items() if n > 1]
    claims = Counter(
        Event.objects.filter(occurrence_id__in=ids, event_type__in=CLAIM_EVENTS).values_list(
            "occurrence_id", flat=True
        )
    )
    for pk, occ in rows.items():
        assert occ.lease_owner is None and occ.lease_expires_at is None, pk
        assert 1 <= occ.attempt <= claims[pk], (pk, occ.attempt, claims[pk])
    return rows


# --------------------------------------------------------------------------- chains

CHAIN = 48  # predecessors of job "chain", in four modes (see _chain_payload)
HANGING = 4  # predecessors of job "chain-hang": ended only by a SIGKILL and their lease's expiry
RANDOM_KILLS = 5


def _chain_payload(i: int) -> dict:
    mode = ("fail", "flaky", "slow", "ok", "ok", "ok")[i % 6]
    seconds = 1.5 if mode == "slow" else 0.05 * (1 + i % 4)
    return {"i": i, "mode": "ok" if mode == "slow" else mode, "seconds": seconds}


def _expected_cause(pred: Occurrence) -> dict:
    cause = {"occurrence_id": pred.pk, "job_id": pred.job_id, "status": pred.status}
    if pred.status == "succeeded":
        cause["result"] = pred.result
    else:
        cause["error"] = pred.last_error
    return cause


def _chain_jobs() -> None:
    authority = granted("chains")
    for job_id in ("then-b", "dead-c"):
        scheduler.create_job(
            job_id, "test.follow", authority=authority, payload={"seconds": 0.1}, max_attempts=10
        )
    scheduler.create_job(
        "chain", "test.step", authority=authority, max_attempts=4, retry_base_delay=0.05, retry_max_delay=0.1
    )
    scheduler.create_job("chain-hang", "test.step", authority=authority, max_attempts=1)


def _enqueue_predecessors() -> list[str]:
    """CHAIN predecessors of every mode and HANGING ones that end only with their worker."""
    follow = {"then": ["then-b"], "on_dead_letter": ["dead-c"]}
    with transaction.atomic():
        preds = [
            scheduler.enqueue(
                "chain", scheduled_for=BASE_MS + i, trigger_key=f"c{i}", payload=_chain_payload(i), **follow
            )[0].pk
            for i in range(CHAIN)
        ]
        preds += [
            scheduler.enqueue(
                "chain-hang",
                scheduled_for=BASE_MS + i,
                trigger_key=f"h{i}",
                payload={"i": i, "mode": "hang", "seconds": 600},
                **follow,
            )[0].pk
            for i in range(HANGING)
        ]
    return preds


def _kill_hanging_holders(fleet: Fleet, rng: random.Random, preds: list[str]) -> None:
    """The hanging ones end only when their worker dies: kill whoever holds one, until all end."""

    def all_ended() -> bool:
        return Occurrence.objects.filter(pk__in=preds, status__in=TERMINAL).count() == len(preds) and not (
            Occurrence.objects.filter(status__in=LIVE).exists()
        )

    deadline = time.monotonic() + 180
    while not all_ended():
        assert time.monotonic() < deadline, (
            Counter(Occurrence.objects.values_list("status")),
            fleet.outputs(),
        )
        holders = set(
            Occurrence.objects.filter(job_id="chain-hang", status="running").values_list(
                "lease_owner", flat=True
            )
        )
        holders &= set(fleet.live)
        if holders:
            fleet.kill(rng.choice(sorted(holders)))
        time.sleep(0.2)


def _assert_one_follow_up_each(preds: list[str], preds_by_pk: dict) -> None:
    follow_ups = list(Occurrence.objects.exclude(pk__in=preds))
    assert {f.job_id for f in follow_ups} <= {"then-b", "dead-c"}
    # One follow-up per predecessor, none twice: by cause, and by trigger key.
    by_cause = Counter(f.caused_by for f in follow_ups)
    assert set(by_cause) == set(preds) and max(by_cause.values()) == 1, by_cause.most_common(3)
    assert len({(f.job_id, f.trigger_key) for f in follow_ups}) == len(follow_ups)
    assert_ended_once([f.pk for f in follow_ups])
    for f in follow_ups:
        pred = preds_by_pk[f.caused_by]
        edge, job_id = ("then", "then-b") if pred.status == "succeeded" else ("on_dead_letter", "dead-c")
        assert (f.job_id, f.trigger_key) == (job_id, f"after:{pred.pk}:{edge}:0"), (f.pk, pred.status)
        assert f.status == "succeeded", (f.pk, f.status, f.last_error)
        assert f.cause == _expected_cause(pred)
        # What the handler saw is what the row says.
        assert f.result["predecessor"] == f.cause and f.result["batch"] is None
        assert f.result["occurrence"] == f.pk


def _assert_each_mode_ended_as_it_must(preds_by_pk: dict) -> None:
    for pk, pred in preds_by_pk.items():
        mode = pred.payload["mode"]
        if mode == "fail":
            assert pred.status == "dead_letter" and pred.last_error["code"] == "E_STEP", pk
        elif mode == "hang":
            assert pred.status == "dead_letter", pk
            assert pred.last_error["code"] == "SCHEDULER_LEASE_EXPIRED", pred.last_error
        elif pred.status == "succeeded":
            assert pred.result == {"occurrence": pk, "attempt": pred.attempt, "i": pred.payload["i"]}


def test_chains_under_sigkill_get_one_follow_up_per_outcome(workers):
    seed = random.randrange(1_000_000)
    rng = random.Random(seed)
    print(f"\n[chains] seed {seed}")
    _chain_jobs()
    fleet = Fleet(workers, 3, rng)
    fleet.wait_ready()
    preds = _enqueue_predecessors()
    kill_at_random(fleet, RANDOM_KILLS, (0.3, 1.5))
    _kill_hanging_holders(fleet, rng, preds)
    fleet.stop()

    preds_by_pk = assert_ended_once(preds)
    outcomes = Counter(p.status for p in preds_by_pk.values())
    reclaims = Event.objects.filter(event_type="occurrence_reclaimed").count()
    print(f"[chains] kills {fleet.kills}, orphaned {fleet.orphaned}, reclaims {reclaims}; {dict(outcomes)}")
    assert "cancelled" not in outcomes
    assert fleet.orphaned >= HANGING, "the hanging predecessors ended without their workers' death"
    _assert_one_follow_up_each(preds, preds_by_pk)
    # Each mode ended as it must, whatever the kills did.
    _assert_each_mode_ended_as_it_must(preds_by_pk)
    assert outcomes["succeeded"] >= 1 and outcomes["dead_letter"] >= CHAIN // 6 + HANGING


# --------------------------------------------------------------------------- batches


def _member_items(n: int) -> list[dict]:
    items = []
    for i in range(n):
        mode = "fail" if i % 10 == 0 else "flaky" if i % 10 == 1 else "ok"
        payload = {"i": i, "mode": mode, "seconds": 0.1 * (1 + i % 3)}
        items.append({"scheduled_for": BASE_MS + i, "trigger_key": f"m{i}", "payload": payload})
    return items


def assert_completed_once(batch_id: str, callback_job: str, size: int) -> Batch:
    """The batch completed with counts equal to its members' final statuses, and has exactly
    one callback, which ran once and saw those counts."""
    batch = Batch.objects.get(pk=batch_id)
    assert batch.status == "completed" and batch.size == size
    members = assert_ended_once(scheduler.batch_members(batch_id))
    assert len(members) == size
    statuses = Counter(m.status for m in members.values())
    assert batch.counts == {status: statuses.get(status, 0) for status in TERMINAL}, (batch.counts, statuses)
    (callback,) = Occurrence.objects.filter(job_id=callback_job)
    assert batch.callback == callback.pk and callback.trigger_key == f"batch:{batch_id}"
    assert callback.batch_id is None and callback.caused_by is None
    assert_ended_once([callback.pk])
    assert callback.status == "succeeded", callback.last_error
    assert callback.cause == {
        "batch_id": batch_id,
        "description": batch.description,
        "size": size,
        "counts": batch.counts,
        "cancelled": False,
    }
    assert callback.result["batch"] == callback.cause and callback.result["predecessor"] is None
    assert Event.objects.filter(event_type="batch_completed", data__batchId=batch_id).count() == 1
    return batch


BATCH = 300


def test_a_batch_under_sigkill_gets_one_callback(workers):
    seed = random.randrange(1_000_000)
    rng = random.Random(seed)
    print(f"\n[batch] seed {seed}")
    authority = granted("batches")
    scheduler.create_job(
        "member", "test.step", authority=authority, max_attempts=3, retry_base_delay=0.05, retry_max_delay=0.1
    )
    scheduler.create_job("batch-done", "test.follow", authority=authority, max_attempts=10)
    fleet = Fleet(workers, 3, rng)
    fleet.wait_ready()
    batch, _ = scheduler.enqueue_batch(
        "member", _member_items(BATCH), callback="batch-done", description="under fire"
    )

    # Kills while the members run, then one near the end, when the last members' commits and
    # their looks for the batch's completion are under way.
    kill_at_random(fleet, 3, (0.2, 1.2))
    left = rng.randint(0, 12)

    def near_end() -> bool:
        return Occurrence.objects.filter(batch_id=batch.pk, status__in=LIVE).count() <= left

    assert wait_for(near_end, 120), fleet.outputs()
    fleet.kill()

    def completed() -> bool:
        done = Batch.objects.filter(pk=batch.pk, status="completed").exists()
        return done and not Occurrence.objects.filter(status__in=LIVE).exists()

    assert wait_for(completed, 120, interval=0.1), (scheduler.batch_progress(batch.pk), fleet.outputs())
    fleet.stop()
    done = assert_completed_once(batch.pk, "batch-done", BATCH)
    reclaims = Event.objects.filter(event_type="occurrence_reclaimed").count()
    print(f"[batch] kills {fleet.kills}, orphaned {fleet.orphaned}, reclaims {reclaims}; {done.counts}")
    assert fleet.orphaned >= 1, "no kill interrupted a member"
    assert done.counts["dead_letter"] >= BATCH // 10  # the "fail" members, at least


LARGE = 2500  # five times the largest claim (MAX_CLAIM_BATCH), 25 members dead-lettered


def test_a_large_batch_drained_by_three_workers_completes_once(workers):
    authority = granted("bulk")
    scheduler.create_job("bulk", "test.step", authority=authority, max_attempts=3)
    scheduler.create_job("bulk-done", "test.follow", authority=authority, max_attempts=10)
    fleet = Fleet(workers, 3, random.Random(0), concurrency=8, lease=30)
    fleet.wait_ready()
    items = [
        {
            "scheduled_for": BASE_MS + i,
            "trigger_key": f"b{i}",
            "payload": {"i": i, "mode": "fail" if i % 100 == 0 else "ok"},
        }
        for i in range(LARGE)
    ]
    started = time.monotonic()
    batch, _ = scheduler.enqueue_batch("bulk", items, callback="bulk-done", description="large")
    enqueued = time.monotonic() - started

    def completed() -> bool:
        return Occurrence.objects.filter(job_id="bulk-done", status="succeeded").exists()

    assert wait_for(completed, 240, interval=0.2), (scheduler.batch_progress(batch.pk), fleet.outputs())
    drained = time.monotonic() - started
    fleet.stop()
    done = assert_completed_once(batch.pk, "bulk-done", LARGE)
    assert done.counts == {"succeeded": LARGE - LARGE // 100, "dead_letter": LARGE // 100, "cancelled": 0}
    per_worker = Counter(
        Event.objects.filter(event_type__in=TERMINAL_EVENTS, occurrence__batch_id=batch.pk).values_list(
            "owner_id", flat=True
        )
    )
    print(
        f"\n[large batch] {LARGE} enqueued in {enqueued:.1f} s, done in {drained:.1f} s; {dict(per_worker)}"
    )
