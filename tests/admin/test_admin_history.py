"""The occurrence and event lists stay flat however much history the tables hold: the same
statements for ten rows as for hundreds, counts bounded (no ``COUNT(*)`` over a whole table),
filter choices from the jobs table and the code, and id searches by the index."""

from __future__ import annotations

import re

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from django_durable_scheduler import kernel
from django_durable_scheduler.db.counting import bounded_count
from django_durable_scheduler.models import Event, Job, Occurrence
from django_durable_scheduler.rules import events

from ..conftest import AUTHORITY

pytestmark = pytest.mark.django_db

OCCURRENCES = reverse("admin:durable_scheduler_occurrence_changelist")
EVENTS = reverse("admin:durable_scheduler_event_changelist")


def _enqueue(count: int, clock, job: str = "job-h", kind: str = "reports.send") -> list[Occurrence]:
    if not Job.objects.filter(pk=job).exists():
        kernel.create_job(job, kind, authority=AUTHORITY)
    items = [{"scheduled_for": clock(), "trigger_key": f"{job}:{i}"} for i in range(count)]
    return [occurrence for occurrence, _ in kernel.enqueue_many(job, items)]


PAGES = (
    (OCCURRENCES, {}),
    (OCCURRENCES, {"status__exact": "queued"}),
    (OCCURRENCES, {"job__job_id__exact": "job-h"}),
    (OCCURRENCES, {"job__kind": "reports.send"}),
    (OCCURRENCES, {"q": "job-h"}),
    (EVENTS, {}),
    (EVENTS, {"event_type": "occurrence_enqueued"}),
    (EVENTS, {"q": "job-h"}),
)


def _statements(admin_client, page: str, params: dict[str, str]) -> list[str]:
    with CaptureQueriesContext(connection) as ctx:
        response = admin_client.get(page, params)
    assert response.status_code == 200
    return [query["sql"] for query in ctx.captured_queries]


def test_the_lists_send_the_same_statements_at_any_size(admin_client, clock):
    _enqueue(5, clock)
    small = {(page, str(params)): len(_statements(admin_client, page, params)) for page, params in PAGES}
    _enqueue(250, clock, job="job-other")  # more than a page, of another job
    _enqueue(250, clock)
    large = {(page, str(params)): len(_statements(admin_client, page, params)) for page, params in PAGES}
    assert large == small


def test_no_count_over_a_whole_table(admin_client, clock):
    _enqueue(120, clock)
    for page, params in PAGES:
        for sql in _statements(admin_client, page, params):
            if re.search(r"\bCOUNT\(", sql, re.IGNORECASE):
                assert re.search(r"\b(WHERE|LIMIT)\b", sql, re.IGNORECASE), (page, params, sql)


def test_filters_list_their_choices_without_reading_history(admin_client, clock):
    _enqueue(3, clock)
    _enqueue(1, clock, job="job-other")
    statements = _statements(admin_client, OCCURRENCES, {})
    assert not [sql for sql in statements if "DISTINCT" in sql.upper() and "occurrences" in sql], statements
    statements = _statements(admin_client, EVENTS, {})
    assert not [sql for sql in statements if "DISTINCT" in sql.upper()], statements
    text = admin_client.get(EVENTS).content.decode()
    for event_type in events.EVENT_TYPES:
        assert f"event_type={event_type}" in text
    assert "job__job_id__exact=job-h" in admin_client.get(OCCURRENCES).content.decode()


def test_event_types_lists_every_type_the_code_writes():
    constants = {value for name, value in vars(events).items() if name.isupper() and isinstance(value, str)}
    assert set(events.EVENT_TYPES) == constants


def test_the_filters_still_filter(admin_client, clock):
    mine = _enqueue(3, clock)
    _enqueue(2, clock, job="job-other")
    occurrence = mine[0]
    kernel.cancel(occurrence.pk)
    listed = admin_client.get(OCCURRENCES, {"status__exact": "cancelled"}).context["cl"].result_list
    assert [row.pk for row in listed] == [occurrence.pk]
    listed = admin_client.get(OCCURRENCES, {"job__job_id__exact": "job-other"}).context["cl"].result_list
    assert {row.job_id for row in listed} == {"job-other"} and len(listed) == 2
    listed = admin_client.get(EVENTS, {"event_type": "occurrence_cancelled"}).context["cl"].result_list
    assert [row.occurrence_id for row in listed] == [occurrence.pk]


def test_searches_find_by_id_exactly_and_else_by_substring(admin_client, clock):
    mine = _enqueue(3, clock)
    _enqueue(2, clock, job="job-other", kind="other.kind")

    def found(page: str, term: str) -> list[object]:
        return list(admin_client.get(page, {"q": term}).context["cl"].result_list)

    assert [row.pk for row in found(OCCURRENCES, mine[1].pk)] == [mine[1].pk]
    assert {row.job_id for row in found(OCCURRENCES, "job-other")} == {"job-other"}
    assert {row.job_id for row in found(OCCURRENCES, "other.kind")} == {"job-other"}
    assert [row.pk for row in found(OCCURRENCES, "job-h:2")] == [mine[2].pk]  # part of a trigger key
    assert found(OCCURRENCES, "no such thing") == []
    assert {row.occurrence_id for row in found(EVENTS, mine[1].pk)} == {mine[1].pk}
    assert {row.job_id for row in found(EVENTS, "job-other")} == {"job-other"}
    assert {row.event_type for row in found(EVENTS, "enqueued")} == {"occurrence_enqueued"}


def test_a_count_is_exact_below_its_bound_and_bounded_above_it(clock):
    _enqueue(20, clock)
    everything = Occurrence.objects.all()
    assert bounded_count(everything, bound=100) == 20
    assert bounded_count(everything.filter(job_id="job-h", status="queued"), bound=100) == 20
    for queryset in (everything, everything.filter(job_id="job-h", status="queued")):
        above = bounded_count(queryset, bound=5)
        if connection.vendor == "postgresql":
            assert above >= 5  # the planner's estimate (of a statement with parameters too), never below
        else:
            assert above == 5
    assert bounded_count(Event.objects.filter(job_id="nobody"), bound=5) == 0
