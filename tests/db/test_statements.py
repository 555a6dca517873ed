"""``statements.unsaved``: the insert paths' instances are the ones ``Model(**values)`` makes."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from django_durable_scheduler.db.statements import unsaved
from django_durable_scheduler.models import Batch, Event, Occurrence

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


def test_an_unknown_name_is_refused():
    with pytest.raises(TypeError, match="Event has no field job, nope"):
        unsaved(Event, {"job": "j", "nope": 1})
