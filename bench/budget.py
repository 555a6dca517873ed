"""The budget part of a claim against the runs a window has had (PostgreSQL).

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/dsch_budget_big \\
        python -m bench.budget [--big 999000] [--small 1000] [--charge-from OLD_budgets.py]

Fills one database of its own (migrated here) with two principals whose current
one-day window holds ``--small`` and ``--big`` reservations (each a settled occurrence, copied
from a template row by ``INSERT ... SELECT generate_series``; usage rows to match), then times
``budgets.charge`` of 100 occurrences per principal inside a transaction that locks the policy
row, as a claim does, and rolls back: median and max of 30 after 3 warm-ups, of the whole charge
and of its reads (the budget state; the rest is writing 100 reservations), and the statements.
``--charge-from`` loads another ``budgets.py`` (say, an earlier commit's, from ``git show``)
to time its ``charge`` on the same rows. ``--hold`` times instead how long a claim holds the
rows that serialize one principal's claims (its policy row, its usage row) per batch size.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import time
from datetime import UTC, datetime
from typing import Any


def _setup(url: str) -> None:
    os.environ["DATABASE_URL"] = url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.settings")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def _copy(model: Any, exprs: dict[str, str], source: str, n: int, params: list[Any]) -> None:
    """Insert ``n`` rows of ``model``: each column from ``exprs`` (SQL over ``t``, the template
    row, and ``g``, the series) or the template's own value."""
    from django.db import connection

    quote = connection.ops.quote_name
    columns = [field.column for field in model._meta.concrete_fields]
    values = [exprs.get(column, f"t.{quote(column)}") for column in columns]
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {quote(model._meta.db_table)} ({', '.join(map(quote, columns))})"
            f" SELECT {', '.join(values)} FROM {source} t CROSS JOIN generate_series(1, %s) g",
            [*params, n],
        )


def _fill(principal: str, n: int) -> None:
    """A policy, a job and ``n`` settled runs of ``principal`` charged in the current window."""
    import django_durable_scheduler as scheduler
    from django_durable_scheduler.kernel import claiming
    from django_durable_scheduler.kernel.authority import budgets
    from django_durable_scheduler.models import AuthorityReservation, AuthorityUsage, Occurrence

    job = f"job-{principal}"
    scheduler.create_job(
        job,
        "bench.noop",
        authority={"principal": {"type": "user", "id": principal}, "requestedCapabilities": ["bench.noop"]},
    )
    scheduler.set_policy(
        "user", principal, capabilities=["bench.noop"], window=86_400, max_runs=1_000_000, max_units=1_000_000
    )
    scheduler.enqueue(job, scheduled_for=datetime.now(UTC), trigger_key="template")
    (template,) = claiming.claim_authorized(owner="fill", lease=60, limit=1).runnable
    scheduler.settle(template.pk, owner="fill", fence=template.fence, outcome="succeeded")
    tag = f"'fill-{principal}-' || g"
    occurrences = f"(SELECT * FROM {Occurrence._meta.db_table} WHERE occurrence_id = %s)"
    _copy(
        Occurrence,
        {"occurrence_id": tag, "idempotency_key": tag, "trigger_key": tag},
        occurrences,
        n - 1,
        [template.pk],
    )
    reservations = f"(SELECT * FROM {AuthorityReservation._meta.db_table} WHERE occurrence_id = %s)"
    _copy(AuthorityReservation, {"occurrence_id": tag}, reservations, n - 1, [template.pk])
    AuthorityUsage.objects.filter(principal_id=principal).update(runs=n, units=n)
    assert all(check.matches for check in budgets.audit_budgets() if check.principal_id == principal)


def _charge_fn(path: str | None) -> Any:
    from django_durable_scheduler.kernel.authority import budgets

    if path is None:
        return budgets.charge
    spec = importlib.util.spec_from_file_location("django_durable_scheduler._budgets_other", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.charge


def _time(principal: str, charge: Any) -> tuple[list[float], int]:
    """Charge 100 queued occurrences of ``principal`` under its locked policy, rolled back."""
    from django.db import connection, transaction
    from django.test.utils import CaptureQueriesContext

    from django_durable_scheduler.models import AuthorityPolicy, Occurrence

    pending = list(Occurrence.objects.filter(job_id=f"job-{principal}", status="queued")[:100])
    assert len(pending) == 100
    samples: list[tuple[float, float]] = []
    statements = 0
    reads: list[float] = []

    def timed(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        start = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            if sql.lstrip().upper().startswith("SELECT"):
                reads.append(time.perf_counter() - start)

    for i in range(33):
        reads.clear()
        with transaction.atomic():
            policy = AuthorityPolicy.objects.select_for_update().get(principal_id=principal)
            with CaptureQueriesContext(connection) as captured, connection.execute_wrapper(timed):
                start = time.perf_counter()
                (out,) = charge([(policy, [(o, 1) for o in pending])], datetime.now(UTC), "default")
                elapsed = time.perf_counter() - start
            assert isinstance(out, list) and len(out) == 100, out
            transaction.set_rollback(True)
        if i >= 3:
            samples.append((elapsed * 1000, sum(reads) * 1000))
            statements = len(captured.captured_queries)
    return samples, statements


def _hold(batches: tuple[int, ...] = (1, 8, 32, 100)) -> None:
    """How long a claim holds the rows that serialize one principal's claims: from its policy
    lock (shared on PostgreSQL) and from its usage lock to the end of the commit, per batch
    size, over ``claim_authorized`` of a principal of its own (median of 12 after 3)."""
    from django.db import connection

    import django_durable_scheduler as scheduler
    from django_durable_scheduler.kernel import claiming
    from django_durable_scheduler.models import Job

    if not Job.objects.filter(pk="job-hold").exists():
        authority = {"principal": {"type": "user", "id": "hold"}, "requestedCapabilities": ["bench.noop"]}
        scheduler.create_job("job-hold", "bench.noop", authority=authority)
        scheduler.set_policy(
            "user",
            "hold",
            capabilities=["bench.noop"],
            window=86_400,
            max_runs=1_000_000,
            max_units=1_000_000,
        )
    marks: dict[str, float] = {}

    def mark(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        if "authority_policies" in sql and " FOR " in sql:
            marks.setdefault("policy", time.perf_counter())
        if "authority_usage" in sql and sql.startswith("SELECT"):
            marks.setdefault("usage", time.perf_counter())
        try:
            return execute(sql, params, many, context)
        finally:
            marks["last"] = time.perf_counter()

    for b in batches:
        rows: list[tuple[float, ...]] = []
        for rep in range(15):
            now = datetime.now(UTC)
            scheduler.enqueue_many(
                "job-hold", [{"scheduled_for": now, "trigger_key": f"{now}:{i}"} for i in range(b)]
            )
            marks.clear()
            with connection.execute_wrapper(mark):
                start = time.perf_counter()
                claimed = claiming.claim_authorized(owner="hold", lease=60, limit=b)
                end = time.perf_counter()
            assert len(claimed.runnable) == b
            for occurrence in claimed.runnable:
                scheduler.settle(occurrence.pk, owner="hold", fence=occurrence.fence, outcome="succeeded")
            if rep >= 3:
                rows.append(
                    tuple(1000 * (end - at) for at in (start, marks["policy"], marks["usage"], marks["last"]))
                )
        whole, policy, usage, commit = (statistics.median(column) for column in zip(*rows, strict=True))
        print(
            f"batch {b:>3}: claim transaction {whole:.1f} ms; from the policy lock {policy:.1f} ms;"
            f" from the usage lock {usage:.1f} ms, of which the commit {commit:.1f} ms",
            flush=True,
        )


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.budget", description=__doc__.split("\n\n")[0])
    parser.add_argument("--small", type=int, default=1_000)
    parser.add_argument("--big", type=int, default=999_000)
    parser.add_argument("--charge-from", default=None, help="another budgets.py whose charge to time")
    parser.add_argument("--no-fill", action="store_true", help="reuse the rows of an earlier run")
    parser.add_argument("--hold", action="store_true", help="only time how long claims hold their locks")
    args = parser.parse_args(argv)
    _setup(os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/dsch_budget_big"))
    if args.hold:
        _hold()
        return 0
    import django_durable_scheduler as scheduler

    for name, n in (("small", args.small), ("big", args.big)):
        if not args.no_fill:
            started = time.perf_counter()
            _fill(name, n)
            print(f"filled {name}: {n:,} reservations in {time.perf_counter() - started:.1f} s", flush=True)
            scheduler.enqueue_many(
                f"job-{name}",
                [{"scheduled_for": datetime.now(UTC), "trigger_key": f"q{i}"} for i in range(100)],
            )
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    charge = _charge_fn(args.charge_from)
    for name, n in (("small", args.small), ("big", args.big)):
        samples, statements = _time(name, charge)
        total = [whole for whole, _ in samples]
        reads = [read for _, read in samples]
        print(
            f"{n:>9,} reservations in the window: charge of 100 median {statistics.median(total):.2f} ms"
            f" (max {max(total):.2f}), of which its reads (SELECT) {statistics.median(reads):.2f} ms"
            f" (max {max(reads):.2f}); {statements} statements",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
