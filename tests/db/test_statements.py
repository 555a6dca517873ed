"""``statements.unsaved``: the insert paths' instances are the ones ``Model(**values)`` makes;
``statements.row_values``: what ``save()`` would take from them; ``statements.prepare``: what it
remembers or passes as it is, is what Django would prepare."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from django.db import connection, models
from django.test import override_settings
from django.test.utils import isolate_apps

from django_durable_scheduler.db.statements import prepare, row_values, unsaved
from django_durable_scheduler.models import Batch, Event, Job, Occurrence

NOW = datetime(2026, 1, 5, 12, tzinfo=UTC)


@pytest.mark.parametrize(
    ("model", "values"),
    [
        (
            Occurrence,
            {
                "occurrence_id": "occ_x",
                "job_id": "j",
                "job_revision": 1,
                "trigger_key": "t",
                "scheduled_for": NOW,
                "available_at": NOW,
                "authority": {"principal": {"type": "user", "id": "u"}},
                "batch_id": "b",
                "cause": {"batch_id": "b"},
                "created_at": NOW,
                "updated_at": NOW,
            },
        ),
        (Event, {"job_id": "j", "event_type": "occurrence_enqueued", "occurred_at": NOW}),
        (Batch, {"batch_id": "b", "callback_job_id": "j", "created_at": NOW}),
    ],
)
def test_an_unsaved_row_is_what_the_model_makes(model, values):
    made, expected = unsaved(model, values), model(**values)
    assert made._state.adding and made._state.db is None
    for field in model._meta.concrete_fields:
        assert getattr(made, field.attname) == getattr(expected, field.attname), field.name


def test_defaults_are_made_per_row():
    # A callable default (Event.data's dict) is called for each row, never shared.
    first, second = (unsaved(Event, {"job_id": "j", "event_type": "x", "occurred_at": NOW}) for _ in range(2))
    assert first.data == {} and first.data is not second.data


@isolate_apps("tests.testapp")
def test_defaults_that_are_not_callable_are_the_objects_django_gives():
    # Django hands every row the same object for a plain default: so does unsaved().
    class Defaulted(models.Model):  # noqa: DJ008
        shared = models.JSONField(default=list(("a",)))
        made = models.JSONField(default=list)
        name = models.CharField(max_length=10)

        class Meta:
            app_label = "testapp"

    first, second = unsaved(Defaulted, {}), Defaulted()
    assert first.shared is second.shared and first.made == [] and first.made is not second.made
    assert first.name == second.name == ""


@isolate_apps("tests.testapp")
def test_row_values_runs_pre_save_where_it_sets_a_value():
    class Stamped(models.Model):  # noqa: DJ008
        made = models.DateTimeField(auto_now_add=True)
        touched = models.DateField(auto_now=True)
        given = models.DateTimeField()
        day = models.DateField()

        class Meta:
            app_label = "testapp"

    row = Stamped(given=NOW, day=NOW.date())
    fields = tuple(field for field in Stamped._meta.concrete_fields if not field.primary_key)
    for _ in range(2):  # the second time from the readers kept for these fields
        ((made, touched, given, day),) = row_values([row], fields)
        assert made is not None and made == row.made and touched == row.touched
        assert given is NOW and day == NOW.date()


def test_an_unknown_name_is_refused():
    with pytest.raises(TypeError, match="Event has no field job, nope"):
        unsaved(Event, {"job": "j", "nope": 1})


def _prepared(how, field, value):
    """What ``how`` prepares (a JSON wrapper's content: psycopg's has no equality), or the type
    of the error it raises."""
    try:
        prepared = how(field, value, connection)
    except ValueError as exc:
        return type(exc)
    return getattr(prepared, "obj", prepared)


def _django(field, value, conn):
    return field.get_db_prep_save(value, conn)


@pytest.mark.django_db
def test_prepare_gives_what_django_gives_each_time():
    row = unsaved(
        Occurrence,
        {
            "occurrence_id": "occ_p",
            "job_id": "j",
            "job_revision": 3,
            "trigger_key": "t",
            "scheduled_for": NOW,
            "available_at": NOW,
            "authority": {"principal": {"type": "user", "id": "u"}},
            "created_at": NOW,
            "updated_at": NOW,
        },
    )
    event = unsaved(Event, {"job_id": "j", "occurrence_id": "occ_p", "event_type": "x", "occurred_at": NOW})
    for _ in range(2):  # the second time from what it remembers
        for made in (row, event):
            for field in type(made)._meta.concrete_fields:
                value = getattr(made, field.attname)
                assert _prepared(prepare, field, value) == _prepared(_django, field, value), field.name


@pytest.mark.django_db
def test_prepare_passes_only_text_of_text_fields_as_it_is():
    trigger, job = Occurrence._meta.get_field("trigger_key"), Occurrence._meta.get_field("job")
    revision = Occurrence._meta.get_field("job_revision")
    assert prepare(trigger, "t", connection) == "t" and prepare(job, "j", connection) == "j"
    # An empty key is the database's business (some take it for NULL); a number field's text is
    # converted by Django.
    assert prepare(job, "", connection) == job.get_db_prep_save("", connection)
    assert prepare(revision, "3", connection) == revision.get_db_prep_save("3", connection) == 3


@pytest.mark.django_db
def test_prepare_tells_field_classes_and_types_apart():
    # One time, remembered for a DateTimeField, then asked for a DateField: a date.
    moment = Occurrence._meta.get_field("created_at")
    day = models.DateField()
    assert prepare(moment, NOW, connection) == moment.get_db_prep_save(NOW, connection)
    assert prepare(day, NOW, connection) == day.get_db_prep_save(NOW, connection)
    assert prepare(day, NOW, connection) != prepare(moment, NOW, connection)
    # 1 remembered for an integer field, then asked for a boolean one: True, a bool.
    revision, enabled = Job._meta.get_field("revision"), Job._meta.get_field("enabled")
    assert type(prepare(revision, 1, connection)) is type(revision.get_db_prep_save(1, connection))
    assert type(prepare(enabled, 1, connection)) is type(enabled.get_db_prep_save(1, connection))


@pytest.mark.django_db
def test_prepare_forgets_when_the_time_settings_change():
    # Without USE_TZ, SQLite and MySQL refuse an aware time: a remembered one must not pass.
    field = Occurrence._meta.get_field("created_at")
    assert _prepared(prepare, field, NOW) == _prepared(_django, field, NOW)
    with override_settings(USE_TZ=False):
        assert _prepared(prepare, field, NOW) == _prepared(_django, field, NOW)
    assert _prepared(prepare, field, NOW) == _prepared(_django, field, NOW)


@pytest.mark.django_db
@pytest.mark.filterwarnings("ignore:DateTimeField .* received a naive datetime")
def test_prepare_does_not_remember_naive_times():
    # 01:30 happens twice on that night in New York; fold tells which, equality does not.
    field = Occurrence._meta.get_field("created_at")
    first, second = datetime(2026, 11, 1, 1, 30), datetime(2026, 11, 1, 1, 30, fold=1)
    with override_settings(TIME_ZONE="America/New_York"):
        for value in (first, second):
            assert _instant(prepare, field, value) == _instant(_django, field, value)
        assert _instant(_django, field, first) != _instant(_django, field, second)


def _instant(how, field, value):
    """What ``how`` prepares, an aware time as its instant (two aware times of one zone compare
    by their wall clock, fold aside: PostgreSQL's are passed as they are)."""
    prepared = _prepared(how, field, value)
    return prepared.timestamp() if isinstance(prepared, datetime) else prepared
