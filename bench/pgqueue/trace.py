"""Where a claim's latency goes at a moderate rate: timestamps along one occurrence's path.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/dschbench_trace PYTHONPATH=. \\
        python -m bench.pgqueue.trace --rate 150 --seconds 20 [--prepared]

The worker runs as the adapter runs it (``runscheduler`` in this process, the adapter's handler),
and a paced producer thread enqueues one occurrence at a time. The worker's own steps are timed
by wrapping them in this process (the listener's wake-up, the loop's settle and claim, the
handler's start), so this is a profiling tool, not a user of the public API. Per occurrence:

- enqueue: the producer's stamp to ``enqueue()`` returning (the commit, and its NOTIFY);
- notify: that return to the first wake-up the listener thread delivers after it;
- to claim: that wake-up to the start of the claim that took the occurrence, and how often a
  settle ran in between (the loop settles what finished before it claims);
- claim: the claim transaction; dispatch: its end to the handler's first line.
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import os
import statistics
import sys
import threading
import time
import uuid


def _pcts(values: list[float]) -> str:
    if not values:
        return "-"
    ordered = sorted(values)
    pick = [ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] for q in (0.5, 0.95, 0.99)]
    return " / ".join(f"{v * 1000:.2f}" for v in pick)


class Trace:
    """Timestamps (time.time()) of each step, appended by the threads that make them."""

    def __init__(self) -> None:
        self.committed: dict[float, float] = {}  # created -> enqueue() returned
        self.wakes: list[float] = []
        self.claims: list[tuple[float, float, list[float]]] = []  # start, end, created of each claimed
        self.settles: list[tuple[float, float]] = []
        self.cpu: dict[str, list[float]] = {"claim": [], "settle": []}  # the loop thread's CPU time in each
        self.started: dict[float, float] = {}  # created -> handler start

    def install(self) -> None:
        """Wrap the worker's steps (the listener's callback, the claim, the settle, the handler)."""
        from django_durable_scheduler.worker import claims, loop, outcomes

        from . import telemetry

        trace = self
        announce, claim, flush = loop.Waker.announce, claims.Claimer.claim, outcomes.OutcomeReporter.flush

        def traced_announce(waker):
            trace.wakes.append(time.time())
            announce(waker)

        def traced_claim(claimer, limit, kinds):
            begun, cpu = time.time(), time.thread_time()
            found = claim(claimer, limit, kinds)
            trace.cpu["claim"].append(time.thread_time() - cpu)
            trace.claims.append(
                (begun, time.time(), [float(o.payload["created_at"]) for o in found if o.payload])
            )
            return found

        def traced_flush(reporter):
            begun, cpu = time.time(), time.thread_time()
            flush(reporter)
            trace.cpu["settle"].append(time.thread_time() - cpu)
            trace.settles.append((begun, time.time()))

        class Recorder(telemetry.Recorder):
            def started(self, created_at: float) -> None:
                trace.started[created_at] = time.time()
                super().started(created_at)

        loop.Waker.announce = traced_announce  # type: ignore[method-assign]
        claims.Claimer.claim = traced_claim  # type: ignore[method-assign]
        outcomes.OutcomeReporter.flush = traced_flush  # type: ignore[method-assign]
        telemetry.RECORDER = Recorder()

    def report(self) -> str:
        """The table of the steps' percentiles, over the occurrences seen from end to end."""
        wakes = sorted(self.wakes)
        settle_ends = sorted(end for _, end in self.settles)
        rows: dict[str, list[float]] = {
            k: [] for k in ("total", "enqueue", "notify", "to claim", "claim", "dispatch")
        }
        settled_between = 0
        claim_of = {created: (begun, end) for begun, end, found in self.claims for created in found}
        for created, committed in self.committed.items():
            if created not in claim_of or created not in self.started:
                continue
            begun, end = claim_of[created]
            i = bisect.bisect_left(wakes, committed)
            wake = wakes[i] if i < len(wakes) and wakes[i] <= begun else begun
            j = bisect.bisect_left(settle_ends, wake)
            settled_between += j < len(settle_ends) and settle_ends[j] <= begun
            for name, value in (
                ("total", self.started[created] - created),
                ("enqueue", committed - created),
                ("notify", wake - committed),
                ("to claim", begun - wake),
                ("claim", end - begun),
                ("dispatch", self.started[created] - end),
            ):
                rows[name].append(max(0.0, value))
        n = len(rows["total"])
        lines = [f"occurrences traced: {n}; a settle ran between wake-up and claim for {settled_between}"]
        lines += [f"  {name:9} p50 / p95 / p99 ms: {_pcts(values)}" for name, values in rows.items()]
        claims = [end - begun for begun, end, found in self.claims if found]
        settles = [end - begun for begun, end in self.settles]
        lines.append(
            f"  claims: {len(claims)}, mean {statistics.fmean(claims or [0]) * 1000:.2f} ms, "
            f"{sum(len(f) for *_, f in self.claims) / max(1, len(claims)):.2f} occurrences each"
        )
        lines.append(f"  settles: {len(settles)}, mean {statistics.fmean(settles or [0]) * 1000:.2f} ms")
        for name, values in self.cpu.items():
            mean = statistics.fmean(values or [0]) * 1000
            lines.append(f"  {name}: the loop thread's CPU, mean {mean:.2f} ms")
        return "\n".join(lines)


def produce(trace: Trace, rate: float, seconds: float, stop: threading.Event) -> None:
    import django_durable_scheduler as scheduler

    from .adapter import JOB_ID

    nonce, next_at, end = uuid.uuid4().hex[:8], time.monotonic() + 1.0, time.monotonic() + 1.0 + seconds
    stop.wait(1.0)  # the worker's listener is up by then
    seq = 0
    while time.monotonic() < end and not stop.is_set():
        next_at += 1.0 / rate
        stop.wait(max(0.0, next_at - time.monotonic()))
        created = time.time()
        scheduler.enqueue(
            JOB_ID,
            scheduled_for=int(created * 1000),
            trigger_key=f"{nonce}:{seq}",
            payload={"created_at": created, "seq": seq, "pad": "x" * 256},
        )
        trace.committed[created] = time.time()
        seq += 1
    time.sleep(1.0)
    os.kill(os.getpid(), 15)  # the worker stops as on SIGTERM


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rate", type=float, default=150.0)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--workers", type=int, default=32)
    parser.add_argument("--prepared", action="store_true", help="the workers' alias that prepares statements")
    args = parser.parse_args()
    if args.prepared:
        os.environ["BENCH_PREPARED"] = "1"
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.pgqueue.settings")
    import django

    django.setup()
    from django.core.management import call_command

    import django_durable_scheduler as scheduler

    from .adapter import JOB_ID
    from .tasks import KIND

    call_command("migrate", verbosity=0, stdout=sys.stderr)
    with contextlib.suppress(scheduler.Conflict):
        scheduler.create_job(JOB_ID, KIND)
    trace = Trace()
    trace.install()
    stop = threading.Event()
    threading.Thread(target=produce, args=(trace, args.rate, args.seconds, stop), daemon=True).start()
    command = ["--concurrency", str(args.workers), "--grace", "3", "--verbosity", "0"]
    call_command("runscheduler", *command, *(["--database", "scheduler"] if args.prepared else []))
    stop.set()
    print(trace.report())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
