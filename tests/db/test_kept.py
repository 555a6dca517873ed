"""``db.kept``: the claim's reads run from plans their connection keeps, on PostgreSQL once the
worker has opted its connection in; the same rows as text, prepared once per connection, made
again after a new connection or an error, and nowhere else (other databases, psycopg's own
server-side binding)."""

from __future__ import annotations

import logging

import pytest
from django.db import DatabaseError, connection, connections, transaction
from django.test.utils import CaptureQueriesContext

import django_durable_scheduler as scheduler
from django_durable_scheduler.db import kept
from django_durable_scheduler.kernel import claiming
from django_durable_scheduler.models import Event, Occurrence

from ..conftest import AUTHORITY

pytestmark = pytest.mark.django_db(transaction=True)

POSTGRES = connection.vendor == "postgresql"
only_postgres = pytest.mark.skipif(not POSTGRES, reason="plans are kept on PostgreSQL only")

READ = "SELECT %s::int + 1 AS n, %s::text AS t WHERE %s::text LIKE 'a%%'"
NAMED = "SELECT %(n)s::int + 1, %(t)s::text, %(n)s::int * 2"


@pytest.fixture
def keeping():
    assert kept.keep_on(connection.alias) == POSTGRES
    yield
    if kept.keeps(connection.alias):
        kept.keep_off(connection.alias)


def prepared() -> set[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT name FROM pg_prepared_statements WHERE name LIKE 'dsch_%%'")
        return {name for (name,) in cursor.fetchall()}


def sent(block) -> list[str]:
    with CaptureQueriesContext(connection) as queries:
        block()
    return [query["sql"].split(" ")[0] for query in queries.captured_queries]


@only_postgres
def test_a_read_is_prepared_once_and_then_executed(keeping):
    # Outside a transaction the PREPARE has one of its own (inside one, a savepoint).
    assert sent(lambda: kept.fetch(connections["default"], READ, [1, "x", "ab"])) == [
        "BEGIN",
        "PREPARE",
        "COMMIT",
        "EXECUTE",
    ]
    assert sent(lambda: kept.fetch(connections["default"], READ, [2, "y", "ab"])) == ["EXECUTE"]
    assert kept.fetch(connections["default"], READ, [2, "y", "ab"]) == [(3, "y")]
    assert kept.fetch(connections["default"], READ, [2, "y", "b"]) == []  # "%%" is the one % of LIKE
    assert kept.fetch(connections["default"], NAMED, {"n": 4, "t": "z"}) == [(5, "z", 8)]
    assert len(prepared()) == 2


@only_postgres
def test_the_rows_are_those_of_the_text(keeping):
    plain = []
    for params in ([1, "x", "ab"], [7, "it's", "a"]):
        with connection.cursor() as cursor:
            cursor.execute(READ, params)
            plain.append(cursor.fetchall())
    assert [
        kept.fetch(connections["default"], READ, params) for params in ([1, "x", "ab"], [7, "it's", "a"])
    ] == plain


@only_postgres
def test_a_new_connection_prepares_again(keeping):
    kept.fetch(connections["default"], READ, [1, "x", "ab"])
    connection.close()
    assert "PREPARE" in sent(lambda: kept.fetch(connections["default"], READ, [1, "x", "ab"]))
    assert len(prepared()) == 1


@only_postgres
def test_after_an_error_the_plans_are_made_again(keeping):
    kept.fetch(connections["default"], READ, [1, "x", "ab"])
    with connection.cursor() as cursor:
        cursor.execute("DEALLOCATE ALL")  # what a pooler's reset or DISCARD ALL does behind its back
    with pytest.raises(DatabaseError), transaction.atomic():
        kept.fetch(connections["default"], READ, [1, "x", "ab"])
    # The next one drops what the server may still hold, and prepares again.
    assert sent(lambda: kept.fetch(connections["default"], READ, [1, "x", "ab"])) == [
        "DEALLOCATE",
        "BEGIN",
        "PREPARE",
        "COMMIT",
        "EXECUTE",
    ]
    assert kept.fetch(connections["default"], READ, [5, "x", "ab"]) == [(6, "x")]


@only_postgres
def test_a_statement_that_cannot_be_prepared_runs_as_text(keeping, caplog):
    # A parameter whose type nothing tells: PREPARE refuses it, text binding does not.
    untyped = "SELECT %s IS NULL"
    with caplog.at_level(logging.WARNING, logger="django_durable_scheduler"), transaction.atomic():
        assert kept.fetch(connections["default"], untyped, [None]) == [(True,)]
        assert kept.fetch(connections["default"], READ, [1, "x", "ab"]) == [
            (2, "x")
        ]  # the transaction is usable
    assert "could not keep a plan on database 'default'" in caplog.text
    assert not kept.keeps("default") and not prepared()


@only_postgres
def test_a_claim_from_kept_plans_is_the_claim(keeping):
    scheduler.ensure_policy(AUTHORITY)
    scheduler.create_job("kept", "test.ok", authority=AUTHORITY)
    ids = [
        scheduler.enqueue("kept", scheduled_for=1_700_000_000_000 + i, trigger_key="t")[0].pk
        for i in range(3)
    ]
    first = claiming.claim_batch(owner="w", lease=60, limit=2, kinds=["test.ok"])
    assert prepared()  # the principals with work, their candidates, the lock of the rows
    second = claiming.claim_batch(owner="w", lease=60, limit=2, kinds=["test.ok"])
    assert sorted(o.pk for o in first + second) == sorted(ids) and len(first) == 2


def test_nothing_is_kept_elsewhere_or_with_server_side_binding(monkeypatch):
    if POSTGRES:
        monkeypatch.setitem(connection.settings_dict, "OPTIONS", {"server_side_binding": True})
    assert not kept.keep_on("default") and not kept.keeps("default")
    assert sent(lambda: kept.fetch(connections["default"], "SELECT %s + 1", [1])) == ["SELECT"]


# ------------------------------------------------- statements run alone (the enqueue's insert)


@pytest.fixture
def alone(monkeypatch):
    """Keeping alone from a clean slate: no database known to drop sessions, nothing kept."""
    monkeypatch.setattr(kept, "_SHARED_ROUTES", set())
    kept.keep_off(connection.alias)
    yield
    kept.keep_off(connection.alias)


def fetch_alone(sql: str = READ, params=(1, "x", "ab")):
    return kept.fetch(connections["default"], sql, list(params), alone=True)


@only_postgres
def test_a_statement_run_alone_is_kept_from_its_second_run(alone):
    assert sent(fetch_alone) == ["SELECT"]  # a connection that runs it once pays no PREPARE
    assert sent(fetch_alone) == ["PREPARE", "EXECUTE"]  # in autocommit: no transaction around it
    assert sent(lambda: fetch_alone(params=(4, "y", "ab"))) == ["EXECUTE"]
    assert fetch_alone(params=(4, "y", "ab")) == [(5, "y")] and len(prepared()) == 1
    # Inside the caller's transaction it is not alone: text, as any statement.
    with transaction.atomic():
        assert sent(fetch_alone) == ["SELECT"]
    # Nor where the caller says the route may drop sessions, nor on a claim's read.
    assert sent(lambda: kept.fetch(connections["default"], READ, [1, "x", "ab"])) == ["SELECT"]


@only_postgres
def test_a_name_the_server_lost_means_a_pooler_and_the_statement_runs_as_text(alone, caplog):
    fetch_alone()
    fetch_alone()
    with connection.cursor() as cursor:
        cursor.execute("DEALLOCATE ALL")  # what another server connection of a pooler looks like
    with caplog.at_level(logging.WARNING, logger="django_durable_scheduler"):
        assert fetch_alone(params=(8, "z", "ab")) == [(9, "z")]
    assert "database 'default' does not keep sessions" in caplog.text
    # Nothing is kept alone on that database again, on this connection or a new one.
    assert sent(fetch_alone) == ["SELECT"]
    connection.close()
    assert [sent(fetch_alone) for _ in range(3)] == [["SELECT"]] * 3
    assert not prepared()


@only_postgres
def test_a_name_the_server_holds_already_means_a_pooler_too(alone, caplog):
    fetch_alone()
    name, text, *_ = kept._numbered(READ)
    assert kept._kept(connections["default"]).seen == {name}
    with connection.cursor() as cursor:  # prepared by another client of the same server session
        cursor.execute(f"PREPARE {name} AS {text}")
    with caplog.at_level(logging.WARNING, logger="django_durable_scheduler"):
        assert fetch_alone(params=(2, "x", "ab")) == [(3, "x")]
    assert "does not keep sessions" in caplog.text
    assert sent(fetch_alone) == ["SELECT"]


@only_postgres
def test_an_error_of_the_statement_itself_is_raised_and_the_next_run_starts_clean(alone):
    failing = "SELECT 1 / %s::int"
    kept.fetch(connections["default"], failing, [1], alone=True)
    kept.fetch(connections["default"], failing, [1], alone=True)
    with pytest.raises(DatabaseError):
        kept.fetch(connections["default"], failing, [0], alone=True)
    assert sent(lambda: kept.fetch(connections["default"], failing, [2], alone=True)) == [
        "DEALLOCATE",
        "PREPARE",
        "EXECUTE",
    ]
    assert kept.fetch(connections["default"], failing, [1], alone=True) == [(1,)]


@only_postgres
def test_the_enqueue_of_a_known_job_keeps_its_insert(alone, settings):
    scheduler.ensure_policy(AUTHORITY)
    job = scheduler.create_job("alone", "test.ok", authority=AUTHORITY)

    def enqueue(i: int, payload=None):
        extra = {} if payload is None else {"payload": payload}
        return scheduler.enqueue("alone", scheduled_for=1_700_000_000_000 + i, trigger_key="t", **extra)

    enqueue(0)  # reads the job, and remembers it
    runs = [sent(lambda i=i: enqueue(i)) for i in (1, 2, 3)]
    assert [[s for s in run if s in ("WITH", "PREPARE", "EXECUTE")] for run in runs] == [
        ["WITH"],
        ["PREPARE", "EXECUTE"],
        ["EXECUTE"],
    ]
    # The kept insert dedupes, refuses another payload for an identity, and sees a job changed.
    occurrence, deduplicated = enqueue(3)
    assert deduplicated and Occurrence.objects.filter(job_id="alone").count() == 4
    with pytest.raises(scheduler.IdempotencyPayloadMismatch):
        enqueue(3, payload={"other": 1})
    scheduler.update_job("alone", expected_revision=job.revision, max_attempts=7)
    assert enqueue(4)[0].max_attempts == 7
    assert Event.objects.filter(occurrence_id=occurrence.pk, event_type="occurrence_enqueued").count() == 1
    # With LISTEN off (a route that may drop sessions), nothing is kept.
    settings.DURABLE_SCHEDULER_LISTEN = False
    kept.keep_off(connection.alias)
    assert [s for i in (5, 6, 7) for s in sent(lambda i=i: enqueue(i))].count("PREPARE") == 0


@only_postgres
def test_what_a_connection_keeps_goes_with_it(alone):
    # A web server may start a thread, so a connection, per request: none of them is held here.
    import gc

    other = connections.create_connection("default")
    try:
        kept.fetch(other, READ, [1, "x", "ab"], alone=True)
        assert kept.fetch(other, READ, [1, "x", "ab"], alone=True) == [(2, "x")]
        assert kept._kept(other) is not None and kept._kept(other).names
    finally:
        other.close()
    entries = len(kept._KEPT)
    del other
    gc.collect()
    assert len(kept._KEPT) == entries - 1
