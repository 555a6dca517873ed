"""Where a worker loop's time goes per occurrence: the claim and the settle, on the clock and
on the CPU (ours only).

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/dschbench_phases \\
        python -m bench.phases [--batches 1,10,100] [--rounds 30] [--warmup 5]

The database is migrated here (use one of its own: the bench's jobs and policy are made in it).
Per batch size B, each round enqueues B no-op occurrences in bulk, then times, in this one
thread, what a worker's loop does with them: ``claiming.claim_authorized(limit=B)`` (the claim
and the authority checks, one transaction) and ``kernel.settle_many`` of their success (one
transaction). The handler is not run (its share is the pool's, on other threads). Printed:
the median over the rounds, per occurrence, of the wall time and the CPU time of this process
(``time.process_time``); the difference is mostly waiting for the database. The CPU time is
what bounds one worker's drain: its loop does both in one thread, under the GIL.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

if str(Path(__file__).resolve().parent.parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.settings")

OWNER = "bench-phases"


def _timed(call: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[Any, tuple[float, float]]:
    """``call``'s return, and the (wall, CPU) seconds it took."""
    wall, cpu = time.perf_counter(), time.process_time()
    value = call(*args, **kwargs)
    return value, (time.perf_counter() - wall, time.process_time() - cpu)


def measure(batch: int, rounds: int, warmup: int) -> dict[str, tuple[float, float]]:
    """Median (wall, cpu) seconds per occurrence of the claim and the settle of ``batch``."""
    from bench.systems import Ours
    from django_durable_scheduler import kernel
    from django_durable_scheduler.kernel import claiming

    ours = Ours()
    samples: dict[str, list[tuple[float, float]]] = {"claim": [], "settle": []}
    for index in range(warmup + rounds):
        ours.new_run()
        ours.enqueue_many(batch)
        batch_claimed, took = _timed(
            claiming.claim_authorized,
            owner=OWNER,
            lease=60,
            limit=batch,
            kinds=["bench.noop"],
            sweep_expired=False,
        )
        claimed = batch_claimed.runnable
        if len(claimed) != batch:
            raise SystemExit(f"claimed {len(claimed)} of {batch}: is something else claiming?")
        outcomes = [{"occurrence_id": row.pk, "fence": row.fence, "outcome": "succeeded"} for row in claimed]
        _, settled = _timed(kernel.settle_many, outcomes, owner=OWNER)
        if index >= warmup:
            samples["claim"].append(took)
            samples["settle"].append(settled)
    return {
        phase: (
            statistics.median(wall for wall, _ in values) / batch,
            statistics.median(cpu for _, cpu in values) / batch,
        )
        for phase, values in samples.items()
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batches", default="1,10,100")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    args = parser.parse_args(argv)
    import django
    from django.core.management import call_command
    from django.db import connection

    django.setup()
    call_command("migrate", verbosity=0)
    from bench.systems import Ours

    ours = Ours()
    ours.setup()
    ours.clear()
    print(f"{connection.vendor}, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, load {os.getloadavg()[0]:.2f}")
    print(f"{'batch':>6} {'phase':>7} {'wall us/occ':>12} {'cpu us/occ':>11}")
    for batch in (int(b) for b in args.batches.split(",")):
        for phase, (wall, cpu) in measure(batch, args.rounds, args.warmup).items():
            print(f"{batch:>6} {phase:>7} {wall * 1e6:>12.1f} {cpu * 1e6:>11.1f}")
    print(f"load at the end {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
