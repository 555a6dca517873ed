"""The migrations: v1 data forward through the v2 backfill and everything after it, then
back; a backfill of 100,000 occurrences; the batching helpers; no stored code in the database;
and, on PostgreSQL, the ``_like`` twins that 0004 drops."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import django
import pytest
from django.db import connection, migrations, models, transaction
from django.db.migrations.executor import MigrationExecutor

from django_durable_scheduler.migrations import _batch

APP = "durable_scheduler"
V1 = [(APP, "0001_initial")]

pytestmark = pytest.mark.django_db(transaction=True)


def migrate(targets):
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(targets)
    return executor.loader.project_state([t for t in targets if t[1] is not None]).apps


def latest():
    executor = MigrationExecutor(connection)
    return [key for key in executor.loader.graph.leaf_nodes() if key[0] == APP]


def plan():
    """The app's migrations in the order they apply."""
    executor = MigrationExecutor(connection)
    return [key for key in executor.loader.graph.forwards_plan(latest()[0]) if key[0] == APP]


@pytest.fixture
def v1_apps():
    apps = migrate(V1)
    try:
        yield apps
    finally:
        migrate(latest())


def envelope(principal_id, caps, ptype="user"):
    return {
        "schemaVersion": 1,
        "principal": {"type": ptype, "id": principal_id},
        "tenantId": "t1",
        "workspaceId": None,
        "requestedCapabilities": sorted(caps),
        "authorizationRefs": {
            "decisionId": "d-1",
            "policyRevision": None,
            "grantIds": [],
            "approvalIds": [],
            "delegationIds": [],
        },
    }


T0 = datetime(2026, 1, 1, tzinfo=UTC)


def make_job(apps, job_id, authority, trigger=None):
    return apps.get_model(APP, "Job").objects.create(
        job_id=job_id,
        kind="k",
        trigger=trigger or {},
        payload=None,
        authority=authority,
        enabled=True,
        revision=1,
        max_attempts=3,
        created_at=T0,
        updated_at=T0,
    )


def make_occurrence(apps, job, n, status, authority):
    terminal = status in ("succeeded", "dead_letter")
    running = status == "running"
    return apps.get_model(APP, "Occurrence").objects.create(
        occurrence_id=f"occ_{job.job_id}_{n}",
        job=job,
        job_revision=1,
        idempotency_key=f"key_{job.job_id}_{n}",
        trigger_key=f"t{n}",
        scheduled_for=T0,
        available_at=T0,
        status=status,
        attempt=1 if (terminal or running) else 0,
        max_attempts=3,
        fence=1 if (terminal or running) else 0,
        lease_owner="w" if running else None,
        lease_expires_at=T0 + timedelta(minutes=1) if running else None,
        authority=authority,
        payload={"n": n},
        created_at=T0,
        updated_at=T0,
        settled_at=T0 if terminal else None,
    )


def snapshot(apps):
    return {
        name: list(apps.get_model(APP, name).objects.order_by("pk").values())
        for name in ("Job", "Occurrence", "Event")
    }


def test_the_squash_stands_for_the_five_migrations_it_replaces():
    """0006 replaces the five migrations that came after the events' partitions while the app
    was unreleased: applying it records their names too, so a database that applied the five
    one by one (their names recorded, not the squash's) needs nothing more."""
    from django.db.migrations.recorder import MigrationRecorder

    from django_durable_scheduler.checks import unapplied_migrations

    executor = MigrationExecutor(connection)
    (squash,) = [key for key in plan() if executor.loader.get_migration(*key).replaces]
    replaced = [tuple(key) for key in executor.loader.get_migration(*squash).replaces]
    assert squash[1].startswith("0006_") and len(replaced) == 5
    assert [name[:4] for _, name in replaced] == ["0006", "0007", "0008", "0009", "0010"]
    recorder = MigrationRecorder(connection)
    assert set(replaced) <= set(recorder.applied_migrations())
    recorder.record_unapplied(*squash)  # the history of a database migrated file by file
    try:
        assert squash not in recorder.applied_migrations()
        assert MigrationExecutor(connection).migration_plan(latest()) == []
        assert unapplied_migrations(connection) == []
    finally:
        recorder.record_applied(*squash)


def test_v1_to_latest_and_back(v1_apps):
    seed_v1(v1_apps)
    before = snapshot(v1_apps)

    started = datetime.now(UTC)
    new = migrate(latest())
    finished = datetime.now(UTC)
    policies = check_policies_backfilled(new)
    check_jobs_bound_and_scheduled(new, started, finished)
    check_occurrences_bound(new)

    # The empty policy stays readable through the public API.
    from django_durable_scheduler.rules.authority import normalize_capabilities

    assert normalize_capabilities(policies[("user", "carol")].capabilities, allow_empty=True) == []

    check_cancelled_go_back_as_dead_letters(new, before)


def seed_v1(apps):
    """v1 jobs of four principals (schedules among them) and occurrences in every v1 status."""
    alice = make_job(apps, "alice-report", envelope("alice", ["reports.read", "reports.send"]))
    make_job(apps, "alice-mail", envelope("alice", ["mail.send"]))
    bob = make_job(apps, "bob-sync", envelope("bob", ["sync.run"], ptype="service"))
    carol = make_job(apps, "carol-noop", envelope("carol", []))
    zoe = make_job(apps, "zoe-every", envelope("zoë", ["poll.run"]), trigger={"every": 300})
    make_job(apps, "zoe-later", envelope("zoë", []), trigger={"at": "2100-01-01T09:00:00Z"})
    make_job(apps, "zoe-past", envelope("zoë", []), trigger={"at": "2026-01-01T00:00:00Z"})
    make_job(apps, "zoe-broken", envelope("zoë", []), trigger={"every": 0})
    make_occurrence(apps, alice, 1, "queued", envelope("alice", ["reports.send", "reports.extra"]))
    make_occurrence(apps, alice, 2, "running", envelope("alice", ["reports.send"]))
    make_occurrence(apps, alice, 3, "retry_wait", envelope("alice", ["reports.send"]))
    # Terminal history with a capability nothing pending needs: validated, not bound, no widening.
    make_occurrence(apps, alice, 4, "succeeded", envelope("alice", ["reports.legacy"]))
    make_occurrence(apps, bob, 1, "dead_letter", envelope("bob", ["sync.old"], ptype="service"))
    make_occurrence(apps, carol, 1, "queued", envelope("carol", []))
    make_occurrence(apps, zoe, 1, "queued", envelope("zoë", ["poll.run"]))
    apps.get_model(APP, "Event").objects.create(
        job=alice, event_type="job_created", occurred_at=T0, data={"revision": 1}
    )


def check_policies_backfilled(new):
    """One policy per principal, granting what its jobs and pending occurrences ask for."""
    Policy = new.get_model(APP, "AuthorityPolicy")
    policies = {(p.principal_type, p.principal_id): p for p in Policy.objects.all()}
    assert set(policies) == {("user", "alice"), ("service", "bob"), ("user", "carol"), ("user", "zoë")}
    assert policies[("user", "alice")].capabilities == [
        "mail.send",
        "reports.extra",
        "reports.read",
        "reports.send",
    ]
    assert policies[("service", "bob")].capabilities == ["sync.run"]
    assert policies[("user", "carol")].capabilities == []
    assert policies[("user", "zoë")].capabilities == ["poll.run"]
    for policy in policies.values():
        assert (policy.revision, policy.enabled, policy.window_ms, policy.max_runs, policy.max_units) == (
            1,
            True,
            86_400_000,
            None,  # 0003's 100,000 runs and units, which nobody configured, lifted by 0009
            None,
        )
    return policies


def check_jobs_bound_and_scheduled(new, started, finished):
    """Every job bound to its principal's first revision, with the default retry delays and
    its first fire time."""
    jobs = {job.pk: job for job in new.get_model(APP, "Job").objects.all()}
    for job in jobs.values():
        assert job.authority["authorizationRefs"]["schedulerPolicyRevision"] == "scheduler-authority:1"
        assert (job.retry_base_delay_ms, job.retry_max_delay_ms, job.last_slot_at) == (
            10_000,
            3_600_000,
            None,
        )
    # First fire times: the next slot after the migration ran (anchored at creation for
    # ``every``), a future ``at``, and none for no schedule, a past ``at`` or a broken trigger.
    every = jobs["zoe-every"].next_fire_at
    assert started < every <= finished + timedelta(seconds=300)
    assert (every - T0) % timedelta(seconds=300) == timedelta(0)
    assert jobs["zoe-later"].next_fire_at == datetime(2100, 1, 1, 9, tzinfo=UTC)
    unscheduled = ("alice-report", "alice-mail", "bob-sync", "carol-noop", "zoe-past", "zoe-broken")
    assert [jobs[pk].next_fire_at for pk in unscheduled] == [None] * len(unscheduled)


def check_occurrences_bound(new):
    """Pending occurrences bound to their principal's policy, terminal ones not; each keyed by
    its principal."""
    Occurrence = new.get_model(APP, "Occurrence")
    occurrences = {o.pk: o for o in Occurrence.objects.all()}
    for pk, occ in occurrences.items():
        refs = occ.authority["authorizationRefs"]
        if occ.status in ("succeeded", "dead_letter"):
            assert "schedulerPolicyRevision" not in refs, pk
        else:
            assert refs["schedulerPolicyRevision"] == "scheduler-authority:1", pk
        assert (occ.metadata, occ.receipt) == (None, None)
    # Canonical JSON of [type, id]: compact, non-ASCII kept.
    assert {pk: occ.principal_key for pk, occ in occurrences.items()} == {
        "occ_alice-report_1": '["user","alice"]',
        "occ_alice-report_2": '["user","alice"]',
        "occ_alice-report_3": '["user","alice"]',
        "occ_alice-report_4": '["user","alice"]',
        "occ_bob-sync_1": '["service","bob"]',
        "occ_carol-noop_1": '["user","carol"]',
        "occ_zoe-every_1": '["user","zoë"]',
    }


def check_cancelled_go_back_as_dead_letters(new, before):
    """Cancelled occurrences (a status v2 does not know) go back as dead letters that say so;
    everything else comes back as it was."""
    Occurrence = new.get_model(APP, "Occurrence")
    settled = T0 + timedelta(hours=1)
    Occurrence.objects.filter(pk="occ_carol-noop_1").update(status="cancelled", settled_at=settled)
    Occurrence.objects.filter(pk="occ_zoe-every_1").update(
        status="cancelled", settled_at=settled, last_error={"code": "X"}
    )
    old = migrate(V1)
    after = snapshot(old)
    back = {row["occurrence_id"]: row for row in after["Occurrence"]}
    assert (back["occ_carol-noop_1"]["status"], back["occ_carol-noop_1"]["last_error"]) == (
        "dead_letter",
        {"code": "SCHEDULER_CANCELLED", "message": "cancelled (migrated back)", "previous": None},
    )
    assert back["occ_zoe-every_1"]["last_error"]["previous"] == {"code": "X"}
    for row in before["Occurrence"]:
        if row["occurrence_id"] in ("occ_carol-noop_1", "occ_zoe-every_1"):
            row.update(
                status="dead_letter", settled_at=settled, last_error=back[row["occurrence_id"]]["last_error"]
            )
    assert after == before


def test_backfill_normalizes_the_envelopes_it_binds(v1_apps):
    """0003 writes each envelope it binds in the normalized v1 form (its own copy of the
    rules); an envelope it cannot read stops the migration, naming the row and the key."""
    apps = v1_apps
    make_job(
        apps,
        "messy",
        {
            "principal": {"type": " user ", "id": " dana "},
            "requestedCapabilities": ["b.two", "a.one", " b.two"],
            "authorizationRefs": {"grantIds": ["g2", "g1", "g2"], "decisionId": None},
        },
    )
    new = migrate(latest())
    assert new.get_model(APP, "Job").objects.get().authority == {
        "schemaVersion": 1,
        "principal": {"type": "user", "id": "dana"},
        "tenantId": None,
        "workspaceId": None,
        "requestedCapabilities": ["a.one", "b.two"],
        "authorizationRefs": {
            "decisionId": None,
            "policyRevision": None,
            "approvalIds": [],
            "delegationIds": [],
            "grantIds": ["g1", "g2"],
            "schedulerPolicyRevision": "scheduler-authority:1",
        },
    }
    assert new.get_model(APP, "AuthorityPolicy").objects.get().capabilities == ["a.one", "b.two"]

    old = migrate(V1)
    old.get_model(APP, "Job").objects.all().delete()
    make_job(old, "bad", {"principal": {"type": "user", "id": "erin"}, "requestedCapabilities": ["*"]})
    with pytest.raises(ValueError, match=r"job bad authority\.requestedCapabilities: must list exact"):
        migrate(latest())
    old.get_model(APP, "Job").objects.all().delete()


def insert_rows(model, rows):
    """INSERT ``rows`` (dicts of field name to value, the same names in each) without the
    ORM's per-object work, which took most of the 100k test's setup: COPY on PostgreSQL
    (psycopg quotes multi-row statements' parameters into their text in Python), else one
    statement that the driver runs for each row (SQLite) or rewrites to many rows (MySQL)."""
    names = list(rows[0])
    fields = [model._meta.get_field(name) for name in names]
    prepared = {}  # envelopes and times, shared by many rows, are prepared once

    def prep(field, value):
        if value is None or type(value) in (str, int):
            return value  # what these columns' preparation returns for them
        key = (field.name, id(value))
        if key not in prepared:  # the entry holds the value, so its id is not reused
            prepared[key] = (value, field.get_db_prep_save(value, connection))
        return prepared[key][1]

    quote = connection.ops.quote_name
    table = quote(model._meta.db_table)
    columns = ", ".join(quote(f.column) for f in fields)
    values = ([prep(f, row[name]) for f, name in zip(fields, names, strict=True)] for row in rows)
    if connection.vendor == "postgresql":
        with (
            connection.connection.cursor() as cursor,
            cursor.copy(f"COPY {table} ({columns}) FROM STDIN") as copy,
        ):
            for row in values:
                copy.write_row(row)
        return
    with transaction.atomic(), connection.cursor() as cursor:  # not a commit a row (SQLite)
        cursor.executemany(
            f"INSERT INTO {table} ({columns}) VALUES ({', '.join(['%s'] * len(fields))})", values
        )


@pytest.mark.skipif(
    django.VERSION >= (6,),
    reason="a scale test of the migrations' own SQL and batching, run on the Django 5.2 legs (all three"
    " databases); the Django 6 legs run the migrations both ways in test_v1_to_latest_and_back",
)
def test_backfill_100k_occurrences(v1_apps, capsys):
    apps = v1_apps
    Occurrence = apps.get_model(APP, "Occurrence")
    jobs = [make_job(apps, f"job-{i}", envelope(f"p{i % 7}", [f"cap.{i % 5}"])) for i in range(20)]
    total = 100_000
    rows = []
    t0 = time.perf_counter()
    for n in range(total):
        job = jobs[n % len(jobs)]
        done = n % 3 == 0
        rows.append(
            {
                "occurrence_id": f"occ_{n:08d}",
                "job": job.pk,
                "job_revision": 1,
                "idempotency_key": f"key_{n:08d}",
                "trigger_key": f"t{n}",
                "scheduled_for": T0,
                "available_at": T0,
                "status": "succeeded" if done else "queued",
                "attempt": 1 if done else 0,
                "max_attempts": 3,
                "fence": 1 if done else 0,
                "authority": job.authority,
                "payload": None,
                "created_at": T0,
                "updated_at": T0,
                "settled_at": T0 if done else None,
            }
        )
    insert_rows(Occurrence, rows)
    del rows
    setup = time.perf_counter() - t0
    t1 = time.perf_counter()
    new = migrate(latest())
    elapsed = time.perf_counter() - t1
    with capsys.disabled():
        print(
            f"\n[backfill] {connection.vendor}: {total} occurrences migrated 0001 -> latest in "
            f"{elapsed:.1f} s (setup {setup:.1f} s)"
        )
    NewOccurrence = new.get_model(APP, "Occurrence")
    assert NewOccurrence.objects.count() == total
    pending = NewOccurrence.objects.filter(status="queued")
    sample = pending.order_by("?")[:50] if connection.vendor != "mysql" else pending[:50]
    for occ in sample:
        assert occ.authority["authorizationRefs"]["schedulerPolicyRevision"] == "scheduler-authority:1"
    assert new.get_model(APP, "AuthorityPolicy").objects.count() == 7
    keys = set(NewOccurrence.objects.values_list("principal_key", flat=True).distinct())
    assert keys == {f'["user","p{i}"]' for i in range(7)}


def test_update_columns_gives_each_row_its_own_values_across_chunks(v1_apps):
    """The data migrations' chunked CASE update: every row, either side of each chunk's edge,
    gets its own value, NULLs and JSON included, and rows outside ``rows`` keep theirs."""
    apps = v1_apps
    Occurrence = apps.get_model(APP, "Occurrence")
    job = make_job(apps, "job-u", envelope("u", ["cap.u"]))
    total = 2 * _batch.CHUNK + 3
    insert_rows(
        Occurrence,
        [
            {
                "occurrence_id": f"occ_{n:04d}",
                "job": job.pk,
                "job_revision": 1,
                "idempotency_key": f"key_{n:04d}",
                "trigger_key": f"t{n}",
                "scheduled_for": T0,
                "available_at": T0,
                "status": "queued",
                "attempt": 0,
                "max_attempts": 3,
                "fence": 0,
                "authority": job.authority,
                "payload": None,
                "created_at": T0,
                "updated_at": T0,
            }
            for n in range(total + 1)
        ],
    )
    rows = list(Occurrence.objects.order_by("pk"))[:total]  # the last row is left out
    for n, row in enumerate(rows):
        row.payload = {"n": n, "quote": 'it\'s "x" %s'} if n % 4 else None
        row.updated_at = T0 + timedelta(seconds=n)
        row.trigger_key = f"it's {n}"
    editor = SimpleNamespace(connection=connection)
    _batch.update_columns(Occurrence, editor, rows, "payload", "updated_at")
    _batch.update_columns(Occurrence, editor, rows, "trigger_key")
    _batch.update_columns(Occurrence, editor, [], "payload")  # nothing to do, no statement
    fields = ("payload", "updated_at", "trigger_key")
    stored = list(Occurrence.objects.order_by("pk").values_list(*fields))
    assert stored[:total] == [tuple(getattr(row, f) for f in fields) for row in rows]
    assert stored[total] == (None, T0, f"t{total}")


def test_batches_walk_the_matching_rows_in_key_order(v1_apps):
    """``_batch.batches``: every matching row once, in primary-key order, ``batch`` at a time,
    also when the caller's update makes a row stop matching (as 0004's way back does)."""
    apps = v1_apps
    Occurrence = apps.get_model(APP, "Occurrence")
    job = make_job(apps, "job-b", envelope("b", []))
    for n in range(7):
        make_occurrence(apps, job, n, "succeeded" if n % 2 else "dead_letter", job.authority)
    seen = []
    for rows in _batch.batches(Occurrence, connection.alias, ["status"], 2, where={"status": "succeeded"}):
        assert 0 < len(rows) <= 2
        seen.extend(row.pk for row in rows)
        Occurrence.objects.filter(pk__in=[row.pk for row in rows]).update(status="dead_letter")
    assert seen == [f"occ_job-b_{n}" for n in (1, 3, 5)]
    everything = [row.pk for rows in _batch.batches(Occurrence, connection.alias, [], 3) for row in rows]
    assert everything == sorted(f"occ_job-b_{n}" for n in range(7))
    assert set(Occurrence.objects.values_list("status", flat=True)) == {"dead_letter"}


def stored_code():
    """Every stored function or procedure, view and trigger of the test database (not the
    database's own: PostgreSQL's internal foreign-key triggers are left out)."""
    queries = {
        "sqlite": ["SELECT type, name FROM sqlite_master WHERE type IN ('view', 'trigger')"],
        "postgresql": [
            "SELECT 'function', p.proname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace"
            " WHERE n.nspname = current_schema()",
            "SELECT 'view', viewname FROM pg_views WHERE schemaname = current_schema()",
            "SELECT 'trigger', tgname FROM pg_trigger WHERE NOT tgisinternal",
        ],
        "mysql": [
            "SELECT routine_type, routine_name FROM information_schema.routines"
            " WHERE routine_schema = DATABASE()",
            "SELECT 'view', table_name FROM information_schema.views WHERE table_schema = DATABASE()",
            "SELECT 'trigger', trigger_name FROM information_schema.triggers"
            " WHERE trigger_schema = DATABASE()",
        ],
    }[connection.vendor]
    found = set()
    with connection.cursor() as cursor:
        for query in queries:
            cursor.execute(query)
            found.update(cursor.fetchall())
    return found


def test_no_migration_leaves_a_stored_function_view_or_trigger():
    """The models are the one definition of the tables (STYLE 11): no migration keeps code in
    the database that repeats their columns, on the way up or at the end."""
    migrate([(APP, None)])
    try:
        for key in plan():
            migrate([key])
            assert stored_code() == set(), key
    finally:
        migrate(latest())
    assert stored_code() == set()


def indexes():
    """PostgreSQL: every index of the scheduler's tables: name -> (table, definition)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT indexname, tablename, indexdef FROM pg_indexes"
            " WHERE schemaname = current_schema() AND tablename LIKE 'durable_scheduler%%'"
        )
        return {name: (table, definition) for name, table, definition in cursor.fetchall()}


KEYS = [("durable_scheduler_occurrences", c) for c in ("occurrence_id", "idempotency_key", "job_id")]
KEYS += [("durable_scheduler_events", c) for c in ("job_id", "occurrence_id")]
KEYS += [("durable_scheduler_authority_reservations", c) for c in ("occurrence_id", "job_id")]

postgresql_only = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="the varchar_pattern_ops twins are PostgreSQL's"
)


@postgresql_only
def test_pattern_twins_of_the_hot_keys_go_and_come_back():
    """0004 drops the ``_like`` twins of the occurrences', events' and reservations' keys, and
    going back makes every index of 0003 again, as Django made it."""
    migrate([(APP, None)])
    try:
        migrate([(APP, "0003_authority_backfill")])
        at_0003 = indexes()
        with connection.schema_editor() as editor:
            twins = {editor._create_index_name(table, [column], suffix="_like") for table, column in KEYS}
        assert twins <= set(at_0003)  # Django made them: the names are right
        migrate(latest())
        assert twins.isdisjoint(indexes())
        # The twins left: the jobs', workers', maintenance leases', concurrency slots', unique
        # locks' and batches' keys, in tables whose rows are inserted rarely (a slot once per
        # limit key, a unique lock once per job, a batch once per batch, then updated in place);
        # and the unique calls' key, one row per keyed enqueue only, which a migration cannot
        # drop in the one that makes it (Django adds the twin when that migration ends).
        left = {table for table, definition in indexes().values() if "pattern_ops" in definition}
        assert left == {
            "durable_scheduler_jobs",
            "durable_scheduler_workers",
            "durable_scheduler_maintenance",
            "durable_scheduler_concurrency_slots",
            "durable_scheduler_unique_locks",
            "durable_scheduler_batches",
            "durable_scheduler_unique_calls",
            # A bucket per throttle key, a place per waiting throttled occurrence and a row per
            # paused kind: only work that uses those features writes them.
            "durable_scheduler_throttle_buckets",
            "durable_scheduler_throttle_places",
            "durable_scheduler_paused_kinds",
        }
        migrate([(APP, "0003_authority_backfill")])
        assert indexes() == at_0003
    finally:
        migrate(latest())


def unnamed(found):
    """Index definitions without their names: what each index is, whatever Django calls it."""
    return {definition.replace(f" {name} ", " ") for name, (_, definition) in found.items()}


@postgresql_only
def test_later_alter_field_on_the_keys_works_without_their_twins(v1_apps):
    """What a later migration may do to these columns (widen a key, make it text, drop or
    restore its uniqueness or its index) runs forward and back on PostgreSQL without the
    twins: Django drops a twin with IF EXISTS and makes one only where it adds an index."""
    apps = v1_apps
    job = make_job(apps, "job-w", envelope("w", []))
    make_occurrence(apps, job, 1, "queued", job.authority)
    executor = MigrationExecutor(connection)
    executor.migrate(latest())
    state = executor.loader.project_state(latest())
    start = indexes()
    long_key = "k" * 90
    protect = models.PROTECT
    for op, holds_long_key in (
        (
            migrations.AlterField(
                "occurrence", "occurrence_id", models.CharField(max_length=100, primary_key=True)
            ),
            False,
        ),
        (
            migrations.AlterField(
                "occurrence", "idempotency_key", models.CharField(max_length=100, unique=True)
            ),
            True,
        ),
        (migrations.AlterField("occurrence", "idempotency_key", models.TextField(unique=True)), True),
        (migrations.AlterField("occurrence", "idempotency_key", models.CharField(max_length=77)), False),
        (
            migrations.AlterField(
                "occurrence", "idempotency_key", models.CharField(max_length=77, db_index=True)
            ),
            False,
        ),
        (
            migrations.AlterField(
                "authorityreservation",
                "job",
                models.ForeignKey(
                    "durable_scheduler.job",
                    protect,
                    related_name="reservations",
                    db_column="job_id",
                    db_index=False,
                ),
            ),
            False,
        ),
        (
            migrations.AlterField(
                "event",
                "occurrence",
                models.ForeignKey(
                    "durable_scheduler.occurrence",
                    protect,
                    related_name="events",
                    db_column="occurrence_id",
                    null=True,
                ),
            ),
            False,
        ),
    ):
        after = state.clone()
        op.state_forwards(APP, after)
        with connection.schema_editor() as editor:
            op.database_forwards(APP, editor, state, after)
        Occurrence = after.apps.get_model(APP, "Occurrence")
        if holds_long_key:
            Occurrence.objects.update(idempotency_key=long_key)
            assert Occurrence.objects.get().idempotency_key == long_key
            Occurrence.objects.update(idempotency_key="key_job-w_1")
        assert Occurrence.objects.get().idempotency_key == "key_job-w_1", op.describe()
        with connection.schema_editor() as editor:
            op.database_backwards(APP, editor, after, state)
    # Every index is there again (a twin too, where going back made Django add an index).
    assert unnamed(start) <= unnamed(indexes())
