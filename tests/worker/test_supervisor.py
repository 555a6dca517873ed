"""``runscheduler --processes N``: forked workers under one supervisor, as real processes. A
child that dies is replaced by a new process and its work comes back once; SIGTERM stops them
all gracefully (exit 0), a second signal hard; a stop at any moment of start-up exits 0;
children stop when their supervisor dies."""

from __future__ import annotations

import os
import random
import re
import signal
import sys
import time

import pytest
from django.core.management import CommandError, call_command

from django_durable_scheduler.models import Event, Occurrence
from django_durable_scheduler.worker import supervisor
from django_durable_scheduler.worker.supervisor import Slot, Supervisor

from ..procs.runner import Worker, Workers, wait_for
from .test_crash import assert_each_succeeded_exactly_once, make, succeeded_count
from .test_recent import run as run_recently

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


@pytest.fixture
def workers(tmp_path):
    spawned = Workers(tmp_path)
    yield spawned
    spawned.cleanup()


def started(worker: Worker) -> list[int]:
    return [int(pid) for pid in re.findall(r"started worker \S+ \(pid (\d+)\)", worker.output(tail=10**6))]


def gone(pid: int) -> bool:
    """Whether process ``pid`` has ended (a zombie awaiting its new parent counts as ended)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True
    except OSError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.mark.parametrize("value", ["0", "-1", "abc"])
def test_bad_process_counts_are_refused_naming_the_option(value):
    with pytest.raises(CommandError, match="--processes"):
        call_command("runscheduler", "--processes", value)


def test_a_killed_child_is_replaced_and_its_work_comes_back_once(workers):
    ids = make("echo", "test.echo", 240, payload={"seconds": 0.03})
    # A lease longer than the test may wait: what the killed child held comes back because
    # the supervisor ends its leases, not because they expire.
    sup = workers.start("--processes", "2", "--concurrency", "4", "--lease", "120", "--grace", "10")
    assert wait_for(lambda: len(started(sup)) == 2 and succeeded_count() >= 8, timeout=60), sup.output()
    victim = started(sup)[0]
    held = Occurrence.objects.filter(status="running", lease_owner__endswith=f":{victim}")
    assert wait_for(held.exists, timeout=30), sup.output()
    os.kill(victim, signal.SIGKILL)
    assert wait_for(lambda: "replaced by pid" in sup.output(), timeout=30), sup.output()
    line = next(line for line in sup.output().splitlines() if "replaced by pid" in line)
    assert re.search(
        rf"\(pid {victim}\) killed by SIGKILL, \d+ of its leases ended; replaced by pid", line
    ), line
    replacement = int(line.rsplit(" ", 1)[1])
    assert replacement not in (victim, *started(sup))
    assert wait_for(lambda: succeeded_count() == len(ids), timeout=90), sup.output()
    assert_each_succeeded_exactly_once(ids)
    abandoned = Event.objects.filter(event_type="occurrence_abandoned", owner_id__endswith=f":{victim}")
    assert abandoned.exists() and not Occurrence.objects.filter(lease_owner__endswith=f":{victim}").exists()
    sup.proc.send_signal(signal.SIGTERM)
    assert sup.wait(timeout=60) == 0, sup.output()
    assert all(gone(pid) for pid in (*started(sup), replacement))


def test_sigterm_stops_every_child_gracefully_and_a_second_one_hard(workers):
    make("sleepy", "test.echo", 12, payload={"seconds": 1.5})
    sup = workers.start("--processes", "2", "--concurrency", "2", "--grace", "20", "--lease", "30")
    assert wait_for(lambda: Occurrence.objects.filter(status="running").count() == 4, timeout=60), (
        sup.output()
    )
    sup.proc.send_signal(signal.SIGTERM)
    assert sup.wait(timeout=60) == 0, sup.output()
    # The four running finished within the grace period; the others stayed queued.
    assert Occurrence.objects.filter(status="succeeded").count() == 4
    assert Occurrence.objects.filter(status="queued").count() == 8
    assert all(gone(pid) for pid in started(sup))

    Occurrence.objects.filter(status="queued").update(payload={"seconds": 60})
    hard = workers.start("--processes", "2", "--concurrency", "2", "--grace", "60", "--lease", "30")
    assert wait_for(lambda: Occurrence.objects.filter(status="running").count() == 4, timeout=60)
    hard.proc.send_signal(signal.SIGTERM)
    assert wait_for(lambda: "stopping the workers" in hard.output(), timeout=30), hard.output()
    hard.proc.send_signal(signal.SIGINT)
    assert hard.wait(timeout=30) == 1, hard.output()
    assert "second signal SIGINT: killing workers" in hard.output()
    assert wait_for(lambda: all(gone(pid) for pid in started(hard)), timeout=10)


def test_children_stop_when_their_supervisor_dies(workers):
    sup = workers.start("--processes", "2")
    assert wait_for(lambda: len(started(sup)) == 2 and sup.output().count(": concurrency ") == 2, timeout=60)
    sup.proc.kill()
    sup.wait(timeout=30)
    assert wait_for(lambda: all(gone(pid) for pid in started(sup)), timeout=30), started(sup)


def catches_sigterm(pid: int) -> bool:
    """Whether process ``pid`` has a handler for SIGTERM (Linux: /proc/PID/status SigCgt)."""
    try:
        with open(f"/proc/{pid}/status") as status:
            caught = next(line for line in status if line.startswith("SigCgt:"))
    except (FileNotFoundError, StopIteration):
        return False
    return bool(int(caught.split()[1], 16) & (1 << (signal.SIGTERM - 1)))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/PID/status")
def test_a_sigterm_at_any_moment_of_start_up_exits_zero_losing_and_doubling_nothing(workers):
    """From the moment ``python -m django_durable_scheduler`` records stop signals (before it
    imports Django) to the children's first claims, at random moments."""
    ids = make("echo", "test.echo", 60, payload={"seconds": 0.01}, max_attempts=5)
    rng = random.Random(os.environ.get("DSCH_SEED", "start-up"))
    for attempt in range(4):
        processes = ("--processes", "2") if attempt % 2 == 0 else ()
        worker = workers.start(*processes, "--lease", "2", "--grace", "10", module="django_durable_scheduler")
        assert wait_for(lambda w=worker: catches_sigterm(w.pid), timeout=30, interval=0.002), worker.output()
        time.sleep(rng.uniform(0, 1.5))
        worker.proc.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=60) == 0, worker.output()
        assert "Traceback" not in worker.output(tail=10**6), worker.output()
        assert wait_for(lambda w=worker: all(gone(pid) for pid in started(w)), timeout=10)
    assert not Occurrence.objects.filter(status="running").exists()
    rest = workers.start("--burst", "--lease", "2")
    assert rest.wait(timeout=90) == 0, rest.output()
    assert_each_succeeded_exactly_once(ids)


def test_a_child_that_keeps_dying_at_start_is_replaced_after_a_growing_back_off(caplog):
    sup = Supervisor(processes=1, make_worker=None, worker_id="w", grace=1, finite=False, stopped=[])  # type: ignore[arg-type]
    slot = sup.slots[0]
    delays = []
    for _ in range(5):
        slot.pid, slot.worker_id, slot.started = 123, "w:123", time.monotonic()
        sup._ended(slot, 1 << 8)  # exit code 1, at once
        delays.append(round(slot.start_at - time.monotonic(), 1))
    assert delays == [0.0, 0.2, 0.5, 1.0, 2.0]
    assert (
        "exited with code 1, 5 times in a row within 1 s of its start; replacing it in 2.00 s" in caplog.text
    )
    slot.pid, slot.started = 124, time.monotonic() - 2 * supervisor.QUICK_DEATH
    sup._ended(slot, signal.SIGKILL)  # a child that ran a while: replaced at once
    assert slot.quick_deaths == 0 and slot.start_at <= time.monotonic() and slot.replacing


def test_a_child_that_finished_its_burst_is_not_replaced():
    sup = Supervisor(processes=1, make_worker=None, worker_id="w", grace=1, finite=True, stopped=[])  # type: ignore[arg-type]
    slot: Slot = sup.slots[0]
    slot.pid, slot.started = 123, time.monotonic()
    sup._ended(slot, 0)
    assert slot.done and slot.start_at is None


def test_the_supervisor_reads_the_recent_run_times_for_its_children(clock):
    """Read once for all the children (each is handed it in its fork), and again after a
    death when it found none before: the dead child's runs may be the first."""
    sup = Supervisor(
        processes=2,
        make_worker=lambda name: supervisor.Worker(worker_id=name, concurrency=8, kinds=["test.ok"]),
        worker_id="w",
        grace=1,
        finite=False,
        stopped=[],
    )
    sup.prepare()
    assert sup.recent.seconds is None and sup.recent.read_at is not None
    run_recently(clock, 200, claims=1, held=0.002)
    assert sup.end_leases("w:2") == ""  # it held nothing; the reading is taken again
    assert sup.recent.seconds == pytest.approx(8 * 0.002 / 200)
    read_at = sup.recent.read_at
    sup.end_leases("w:3")  # found some, and not RECENT_EVERY old: not read again
    assert sup.recent.read_at == read_at


@pytest.mark.django_db(transaction=True)
def test_a_deadlock_ending_a_dead_childs_leases_is_tried_again(monkeypatch, caplog):
    """The database may undo the ending as a deadlock's loser (MariaDB's gap locks meet a
    claim's): tried again, the work comes back at once instead of at its lease's end."""
    from django.db import OperationalError

    import django_durable_scheduler as scheduler
    from django_durable_scheduler import kernel
    from django_durable_scheduler.kernel import claiming

    from ..conftest import AUTHORITY

    scheduler.ensure_policy(AUTHORITY)
    scheduler.create_job("dl", "test.ok", authority=AUTHORITY)
    scheduler.enqueue("dl", scheduled_for=1_700_000_000_000, trigger_key="t")
    (claimed,) = claiming.claim_batch(owner="w:9", lease=600, limit=1, kinds=["test.ok"])
    abandon, failures = kernel.abandon, []

    def deadlocked_first(owner, **kwargs):
        if not failures:
            failures.append(owner)  # as Django raises MySQL's 1213, the transaction undone
            raise OperationalError(1213, "Deadlock found when trying to get lock; try restarting transaction")
        return abandon(owner, **kwargs)

    monkeypatch.setattr(kernel, "abandon", deadlocked_first)
    sup = Supervisor(processes=1, make_worker=None, worker_id="w", grace=1, finite=False, stopped=[])  # type: ignore[arg-type]
    assert sup.end_leases("w:9") == ", 1 of its leases ended" and failures == ["w:9"]
    assert Event.objects.filter(occurrence_id=claimed.pk, event_type="occurrence_abandoned").count() == 1
