"""The budget state a claim reads (``docs/design.md``, "Budgets and reservations"): the usage
row, kept by the charges themselves, never a count of the window's reservations; the
recount is the audit's (``audit_budgets``, ``scheduler_status --check-budgets``), which
marks a mismatching window so that the claims refuse it."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext

import django_durable_scheduler as scheduler
from django_durable_scheduler.housekeeping.retention.thread import run_once
from django_durable_scheduler.kernel import claiming
from django_durable_scheduler.models import AuthorityReservation, AuthorityUsage, Occurrence

from ..conftest import authority_for

pytestmark = pytest.mark.django_db

OWNER = "w1"
HOUR = 3600


@pytest.fixture
def alice(clock):
    scheduler.create_job("job-a", "reports.send", authority=authority_for("alice", "reports.send"))
    scheduler.set_policy(
        "user", "alice", capabilities=["reports.send"], window=HOUR, max_runs=10_000, max_units=10_000
    )
    return clock


def enqueue(clock, n, tag):
    for i in range(n):
        scheduler.enqueue("job-a", scheduled_for=clock(), trigger_key=f"{tag}{i}")


def claim(n):
    return claiming.claim_authorized(owner=OWNER, lease=60, limit=n)


def window_reads(statements):
    """The statements that read the reservations table by anything but its primary key."""
    table = AuthorityReservation._meta.db_table
    found = []
    for sql in statements:
        head = sql.lstrip().upper()
        # An insert, alone or after the usage rows' UPDATE in its WITH (PostgreSQL), reads nothing.
        if (
            table not in sql
            or head.startswith("INSERT")
            or (head.startswith("WITH") and ") INSERT INTO " in head)
        ):
            continue
        where = sql.split(" WHERE ", 1)[-1]
        if "COUNT(" in sql.upper() or "principal_id" in where or "window_started_at" in where:
            found.append(sql)
    return found


def captured_claim(n):
    with CaptureQueriesContext(connection) as captured:
        result = claim(n)
    assert len(result.runnable) == n
    return [query["sql"] for query in captured.captured_queries]


def test_a_claim_does_not_read_the_windows_reservations(alice):
    """The same statements at 5 and at 205 reservations in the window, none of them reading
    the window's reservations (a window's first charge probes them once, with EXISTS)."""
    enqueue(alice, 5, "a")
    first = captured_claim(5)
    assert any("EXISTS" in sql for sql in first)  # the window's first charge: none may exist yet
    enqueue(alice, 5, "b")
    few = captured_claim(5)
    enqueue(alice, 200, "c")
    assert len(claim(200).runnable) == 200
    enqueue(alice, 5, "d")
    many = captured_claim(5)
    assert AuthorityReservation.objects.count() == 215
    assert window_reads(few) == [] and window_reads(many) == []
    assert len(few) == len(many)
    assert list(AuthorityUsage.objects.values_list("runs", "units", "mismatch")) == [(215, 215, None)]


def test_a_claim_trusts_an_unaudited_usage_row(alice):
    """Until an audit recounts, the usage row is the budget: a tampered row is charged on."""
    enqueue(alice, 2, "a")
    claim(2)
    AuthorityUsage.objects.update(runs=9_999)
    enqueue(alice, 2, "b")
    result = claim(2)
    assert len(result.runnable) == 1 and len(result.refused) == 1  # max_runs 10,000
    assert result.refused[0][1].verdict == "deferred"


def test_audit_marks_a_mismatch_until_a_recount_agrees(alice):
    enqueue(alice, 3, "a")
    claim(3)
    assert [c.matches for c in scheduler.audit_budgets()] == [True]
    usage = AuthorityUsage.objects.get()
    assert usage.verified_at == alice() and usage.mismatch is None
    AuthorityUsage.objects.update(units=7)
    (check,) = scheduler.audit_budgets()
    assert (check.usage, check.reservations) == ((3, 7), (3, 3))
    assert "user:alice revision 1" in check.describe()
    enqueue(alice, 2, "b")
    result = claim(2)
    assert [verdict.error["reason"] for _, verdict in result.refused] == ["budget_state_invalid"] * 2
    details = result.refused[0][1].error["details"]
    assert details["usage"] == {"runs": 3, "units": 7} and details["reservations"] == {"runs": 3, "units": 3}
    assert details["checkedAt"] == "2026-01-05T12:00:00.000Z"
    assert AuthorityUsage.objects.get().runs == 3  # nothing charged
    AuthorityUsage.objects.update(units=3)  # the operator's repair
    assert [c.matches for c in scheduler.audit_budgets()] == [True]
    enqueue(alice, 2, "c")
    assert len(claim(2).runnable) == 2
    assert list(AuthorityUsage.objects.values_list("runs", "units", "mismatch")) == [(5, 5, None)]


def test_a_new_window_with_reservations_is_refused_and_marked(alice):
    """A window without a usage row must have no reservations: its first charge checks (one
    EXISTS), refuses, and leaves the row at zero with the counts, which later claims read."""
    enqueue(alice, 2, "a")
    claim(2)
    AuthorityUsage.objects.all().delete()  # tampered
    enqueue(alice, 1, "b")
    result = claim(1)
    ((_, verdict),) = result.refused
    assert verdict.error["reason"] == "budget_state_invalid"
    assert verdict.error["details"]["reservations"] == {"runs": 2, "units": 2}
    assert verdict.error["details"]["usage"] == {"runs": 0, "units": 0}
    usage = AuthorityUsage.objects.get()
    assert (usage.runs, usage.units, usage.mismatch["reservations"]) == (0, 0, {"runs": 2, "units": 2})
    enqueue(alice, 1, "c")
    with CaptureQueriesContext(connection) as captured:
        later = claim(1)
    assert [v.error["reason"] for _, v in later.refused] == ["budget_state_invalid"]
    assert window_reads([q["sql"] for q in captured.captured_queries]) == []
    assert Occurrence.objects.filter(status="dead_letter").count() == 2


def test_audit_finds_reservations_without_a_usage_row(alice):
    enqueue(alice, 2, "a")
    claim(2)
    AuthorityUsage.objects.all().delete()
    (check,) = scheduler.audit_budgets()
    assert (check.usage, check.reservations, check.matches) == ((0, 0), (2, 2), False)
    assert AuthorityUsage.objects.get().mismatch["reservations"] == {"runs": 2, "units": 2}


def test_audit_covers_the_current_window_of_the_current_revision_only(alice):
    enqueue(alice, 2, "a")
    for occurrence in claim(2).runnable:
        scheduler.settle(occurrence.pk, owner=OWNER, fence=occurrence.fence, outcome="succeeded")
    AuthorityUsage.objects.update(runs=1)
    alice.advance(seconds=HOUR)
    assert scheduler.audit_budgets() == []  # the tampered window has ended: nothing charges it
    enqueue(alice, 1, "b")
    assert len(claim(1).runnable) == 1
    assert [(c.usage, c.matches) for c in scheduler.audit_budgets()] == [((1, 1), True)]


def test_scheduler_status_check_budgets(alice):
    enqueue(alice, 2, "a")
    claim(2)
    out = StringIO()
    call_command("scheduler_status", "--check-budgets", "--max-lag", "1h", stdout=out, stderr=StringIO())
    assert "Budget windows recounted: 1, mismatched: 0" in out.getvalue()
    AuthorityUsage.objects.update(runs=5)
    out, err = StringIO(), StringIO()
    with pytest.raises(SystemExit) as info:
        call_command("scheduler_status", "--check-budgets", "--json", stdout=out, stderr=err)
    assert info.value.code == 1
    found = json.loads(out.getvalue())
    assert found["healthy"] is False
    assert [c["matches"] for c in found["budget_checks"]] == [False]
    assert found["budget_checks"][0]["usage"] == {"runs": 5, "units": 2}
    assert "budget usage does not match its reservations: user:alice" in err.getvalue()


def test_a_claim_locks_the_usage_row_last(alice):
    """What serializes one principal's claims is the usage row, locked after the occurrences
    are claimed; the policy row, locked before them, is shared where the database can
    (PostgreSQL), so that claims of one principal do not queue for their whole transaction."""
    enqueue(alice, 2, "a")
    claim(2)
    enqueue(alice, 2, "b")
    statements = captured_claim(2)
    usage = AuthorityUsage._meta.db_table
    policy = [sql for sql in statements if "authority_policies" in sql and "FOR " in sql]
    (usage_lock,) = [i for i, sql in enumerate(statements) if usage in sql and sql.startswith("SELECT")]
    claimed = [
        i
        for i, sql in enumerate(statements)
        # On PostgreSQL the UPDATE goes as a WITH clause of the claim's events' insert.
        if sql.startswith(("UPDATE", "WITH"))
        and f"UPDATE {connection.ops.quote_name(Occurrence._meta.db_table)}" in sql
    ]
    assert claimed and usage_lock > max(claimed)
    if connection.vendor == "postgresql":
        assert [sql.endswith("FOR SHARE") for sql in policy] == [True]
    elif connection.vendor == "mysql":
        assert [sql.endswith("FOR UPDATE") for sql in policy] == [True]


def test_several_principals_with_new_and_running_windows(clock):
    """One claim charging a principal whose window just began (its usage row created) and
    one whose window goes on: both charged, each on its own row."""
    for name, window in (("ann", HOUR), ("bea", 24 * HOUR)):
        scheduler.create_job(f"job-{name}", "reports.send", authority=authority_for(name, "reports.send"))
        scheduler.set_policy(
            "user", name, capabilities=["reports.send"], window=window, max_runs=100, max_units=100
        )

    def both(tag):
        for name in ("ann", "bea"):
            scheduler.enqueue(f"job-{name}", scheduled_for=clock(), trigger_key=tag)
        result = claim(2)
        assert len(result.runnable) == 2
        for occurrence in result.runnable:
            scheduler.settle(occurrence.pk, owner=OWNER, fence=occurrence.fence, outcome="succeeded")

    both("a")
    clock.advance(seconds=HOUR)
    both("b")
    rows = AuthorityUsage.objects.order_by("principal_id", "window_started_at")
    assert [(u.principal_id, u.runs, u.mismatch) for u in rows] == [
        ("ann", 1, None),
        ("ann", 1, None),
        ("bea", 2, None),
    ]
    assert all(check.matches for check in scheduler.audit_budgets())


def test_the_workers_retention_run_recounts_the_budgets(alice, settings, caplog):
    """The workers audit the budgets with each retention run (one worker at a time): a window
    whose usage row was edited is marked, and its next claim is refused."""
    settings.DURABLE_SCHEDULER_RETENTION = {"period": 1}
    enqueue(alice, 3, "a")
    assert len(claim(3).runnable) == 3
    AuthorityUsage.objects.update(runs=1)  # by hand: the claims would trust it
    result = run_once("w-retention")
    assert result is not None and result.budget_mismatches == 1
    assert "does not match its reservations" in caplog.text
    enqueue(alice, 1, "b")
    refused = claim(1).refused
    assert [verdict.error["reason"] for _, verdict in refused] == ["budget_state_invalid"]
