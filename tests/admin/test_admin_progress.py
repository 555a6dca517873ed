"""A running handler's progress in the admin: on the occurrence's page, in the occurrences
list and beside its kind in the dashboard's workers, as a bar and ``done / total (pct%) note``."""

from __future__ import annotations

import pytest
from django.urls import reverse

from django_durable_scheduler import kernel
from django_durable_scheduler.models import Occurrence, WorkerHeartbeat

from ..conftest import CLOCK_START

LEASE = 60


@pytest.fixture
def running(job, clock):
    kernel.enqueue("job-a", scheduled_for=CLOCK_START, trigger_key="p")
    (row,) = kernel.claim_batch(owner="w1", lease=LEASE, limit=1, sweep_expired=False)
    kernel.record_progress(row.pk, owner="w1", fence=row.fence, done=30, total=120, note="rows <copied>")
    WorkerHeartbeat.objects.create(
        worker_id="w1", hostname="host", pid=1, concurrency=4, started_at=clock(), last_seen_at=clock()
    )
    return row


def page(admin_client, url: str) -> str:
    response = admin_client.get(url)
    assert response.status_code == 200
    return response.content.decode()


def test_the_occurrence_page_shows_a_bar_and_the_text(admin_client, running):
    html = page(admin_client, reverse("admin:durable_scheduler_occurrence_change", args=[running.pk]))
    assert '<progress max="120" value="30"></progress> 30 / 120 (25%) rows &lt;copied&gt;' in html
    assert '"fence"' not in html  # the stored JSON is shown in words, not as it is stored


def test_the_occurrences_list_shows_it_in_a_column(admin_client, running):
    html = page(admin_client, reverse("admin:durable_scheduler_occurrence_changelist"))
    assert "column-progress_summary" in html
    assert "30 / 120 (25%)" in html


def test_the_dashboard_shows_it_beside_the_running_kind(admin_client, running):
    html = page(admin_client, reverse("admin:durable_scheduler_schedulerdashboard_changelist"))
    workers = html.split('id="dsch-workers"', 1)[1].split('id="dsch-retention"', 1)[0]
    assert 'reports.send</a> <span class="dsch-progress"><progress max="120" value="30">' in workers
    assert "30 / 120 (25%) rows &lt;copied&gt;" in workers


def test_without_a_total_the_bar_is_indeterminate(admin_client, running):
    kernel.record_progress(running.pk, owner="w1", fence=running.fence, done=7)
    html = page(admin_client, reverse("admin:durable_scheduler_occurrence_change", args=[running.pk]))
    assert '<span class="dsch-progress"><progress></progress> 7</span>' in html


def test_a_report_of_an_earlier_attempt_says_so(admin_client, running, clock):
    clock.advance(LEASE + 1)
    (again,) = kernel.claim_batch(owner="w2", lease=LEASE, limit=1, sweep_expired=False)
    assert again.fence == running.fence + 1
    html = page(admin_client, reverse("admin:durable_scheduler_occurrence_change", args=[running.pk]))
    assert "30 / 120 (25%) rows &lt;copied&gt; (an earlier attempt&#x27;s)" in html


def test_an_occurrence_without_progress_shows_none(admin_client, job):
    occurrence, _ = kernel.enqueue("job-a", scheduled_for=CLOCK_START, trigger_key="q")
    assert Occurrence.objects.get(pk=occurrence.pk).progress is None
    html = page(admin_client, reverse("admin:durable_scheduler_occurrence_change", args=[occurrence.pk]))
    assert "<progress" not in html
