"""The run-time check of occurrence writes (tests/writecheck.py, docs/design.md, "Occurrence
lifecycle"): it is on every connection the tests open (threads and worker processes too),
it refuses an UPDATE that writes a column its action does not set and one the package sends
with no action named, and the kernel's real writes, each named, pass it."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.conf import settings
from django.db import connection, transaction

import django_durable_scheduler as scheduler
from django_durable_scheduler import kernel
from django_durable_scheduler.kernel.writing import announced, writing
from django_durable_scheduler.models import Occurrence
from django_durable_scheduler.rules.lifecycle import TRANSITION, Action

from ..conftest import CLOCK_START, run_python
from ..writecheck import WrongOccurrenceWrite, assigned_columns, check_statement, check_writes

pytestmark = pytest.mark.skipif(
    not settings.CHECK_OCCURRENCE_WRITES, reason="the write check is off (DSCH_CHECK_WRITES=0)"
)


def _queued(clock, key: str = "t") -> Occurrence:
    return kernel.enqueue("job-a", scheduled_for=CLOCK_START, trigger_key=key, available_at=clock())[0]


def test_it_is_on_the_connection_of_each_thread(db):
    connection.ensure_connection()
    assert check_writes in connection.execute_wrappers
    seen: list[bool] = []

    def query() -> None:
        from django.db import connection as this_threads

        try:
            this_threads.ensure_connection()
            seen.append(check_writes in this_threads.execute_wrappers)
        finally:
            this_threads.close()

    thread = threading.Thread(target=query)
    thread.start()
    thread.join()
    assert seen == [True]


@pytest.mark.django_db(transaction=True)
def test_it_is_on_the_connection_of_a_process_started_with_the_test_settings():
    code = (
        "import django; django.setup()\n"
        "from django.db import connection\n"
        "from tests.writecheck import check_writes\n"
        "connection.ensure_connection()\n"
        "print(check_writes in connection.execute_wrappers)\n"
    )
    out, err = run_python(code).communicate(timeout=120)
    assert out.strip() == "True", err


def test_a_column_the_action_does_not_set_is_refused_and_not_written(job, clock):
    row = _queued(clock)
    now = clock.advance(5)
    with pytest.raises(WrongOccurrenceWrite) as caught, transaction.atomic(), writing(Action.RUN_NOW):
        Occurrence.objects.filter(pk=row.pk).update(available_at=now, updated_at=now, priority=5)
    message = str(caught.value)
    assert "run_now" in message and "['priority']" in message and "UPDATE" in message
    assert Occurrence.objects.get(pk=row.pk).priority == row.priority


def test_a_column_the_action_sets_and_the_update_leaves_out_is_refused(job, clock):
    row = _queued(clock)
    with (
        pytest.raises(WrongOccurrenceWrite, match=r"leaves out \['updated_at'\]"),
        transaction.atomic(),
        writing(Action.RUN_NOW),
    ):
        Occurrence.objects.filter(pk=row.pk).update(available_at=clock())


def test_an_update_the_package_sends_with_no_action_named_is_refused(job, clock):
    row = _queued(clock)
    # Code of a package module, as a writer that forgot to name its action would be.
    namespace: dict[str, Any] = {
        "__name__": "django_durable_scheduler.kernel.forgetful",
        "Occurrence": Occurrence,
    }
    exec("def touch(pk, now):\n    Occurrence.objects.filter(pk=pk).update(updated_at=now)\n", namespace)
    forgetful = r"forgetful updates .* with no lifecycle action named"
    with pytest.raises(WrongOccurrenceWrite, match=forgetful), transaction.atomic():
        namespace["touch"](row.pk, clock())
    assert announced() is None


def test_a_tests_hand_edit_and_other_tables_pass_unnamed(job, clock):
    row = _queued(clock)
    Occurrence.objects.filter(pk=row.pk).update(priority=3)  # a test setting up its case
    scheduler.update_job("job-a", payload={"n": 2}, expected_revision=job.revision)
    assert Occurrence.objects.get(pk=row.pk).priority == 3


def test_the_kernels_writes_each_name_their_action_and_pass(job, clock, settings):
    """The claim (its hand-written UPDATE, inside a WITH on PostgreSQL), a grouped settle,
    renew, request_cancel, cancel and a rebind's bulk_update, as the check sees them."""
    seen: list[tuple[Action | None, set[str]]] = []
    table = connection.ops.quote_name(Occurrence._meta.db_table)

    def spy(execute, sql, params, many, context):
        head = f"UPDATE {table} SET "
        if head in sql:
            seen.append((announced(), set(assigned_columns(sql, sql.index(head) + len(head)))))
        return execute(sql, params, many, context)

    rows = [_queued(clock, key) for key in "abcd"]
    with connection.execute_wrapper(spy):
        claimed = kernel.claim_batch(owner="w", lease=60, limit=2, sweep_expired=False)
        kernel.renew(claimed[0].pk, owner="w", fence=claimed[0].fence, lease=120)
        kernel.settle_many(
            [{"occurrence_id": r.pk, "fence": r.fence, "outcome": "succeeded"} for r in claimed], owner="w"
        )
        waiting = [r for r in rows if r.pk not in {c.pk for c in claimed}]
        kernel.cancel(waiting[0].pk, reason="enough")
        scheduler.set_policy(
            "user", "alice", capabilities=["reports.send"], window=3600, max_runs=9, max_units=9
        )
    expected = [Action.CLAIM, Action.RENEW, Action.SETTLE_SUCCEEDED, Action.CANCEL, Action.REBIND]
    assert [action for action, _ in seen] == expected
    assert all(columns == set(TRANSITION[action].sets) for action, columns in seen if action)


@pytest.mark.parametrize(
    ("sql", "columns"),
    [
        (
            'UPDATE "o" SET "status" = %s, "attempt" = ("o"."attempt" + 1) WHERE "o"."id" IN (%s)',
            ["status", "attempt"],
        ),
        (
            "UPDATE `o` SET `lease_expires_at` = GREATEST(`o`.`lease_expires_at`, %s), `updated_at` = %s",
            ["lease_expires_at", "updated_at"],
        ),
        (
            'UPDATE "o" SET "authority" = CASE WHEN ("o"."occurrence_id" = %s) THEN %s::jsonb ELSE NULL END, '
            '"updated_at" = CASE WHEN ("o"."occurrence_id" = %s) THEN %s END WHERE "o"."pk" IN (%s)',
            ["authority", "updated_at"],
        ),
        (
            'WITH w0 AS (UPDATE "o" SET "fence" = "o"."fence" + 1, "status" = \'a,b\' WHERE x) INSERT',
            ["fence", "status"],
        ),
    ],
    ids=["orm", "mysql-quoted", "bulk-update", "inside-with"],
)
def test_the_set_list_is_read_on_every_quoting(sql, columns):
    assert assigned_columns(sql, sql.index(" SET ") + 5) == columns


def test_a_select_that_names_the_table_is_not_checked(db):
    table = connection.ops.quote_name(Occurrence._meta.db_table)
    check_statement(f"SELECT * FROM {table} WHERE 1 = 0", connection)  # no UPDATE: nothing to say
    with pytest.raises(WrongOccurrenceWrite), writing(Action.RENEW):
        check_statement(f"UPDATE {table} SET {connection.ops.quote_name('status')} = %s", connection)
