"""Throttles in the admin, through Django's test client: the job form and the policy form take
a throttle as JSON text, show the stored one with its period in seconds, check it with the
API's normalizer (a bad one is an error on the ``throttle`` field naming the setting, nothing
written) and save it through ``update_job`` / ``set_policy``."""

from __future__ import annotations

import json
from html import unescape

import pytest

import django_durable_scheduler as scheduler
from django_durable_scheduler.models import AuthorityPolicy, Job

from ..conftest import AUTHORITY, snapshot
from .test_admin import form_errors, job_data, policy, policy_data, url  # noqa: F401 (policy: a fixture)

pytestmark = pytest.mark.django_db

THROTTLE = {"limit": 100, "period": 5, "burst": 20, "key": "{account}"}


def test_a_job_throttle_is_added_shown_changed_and_emptied(admin_client, clock):
    data = {
        "job_id": "paced",
        "kind": "reports.send",
        "trigger": "{}",
        "payload": "null",
        "authority": json.dumps(AUTHORITY),
        "enabled": "on",
        "max_attempts": 3,
        "throttle": json.dumps(THROTTLE),
        "loaded_revision": 0,
        "_save": "Save",
    }
    response = admin_client.post(url("job", "add"), data)
    assert response.status_code == 302, form_errors(response)
    job = Job.objects.get(pk="paced")
    assert job.throttle == {"limit": 100, "period_ms": 5000, "burst": 20, "key": "{account}"}

    page = unescape(admin_client.get(url("job", "change", "paced")).content.decode())
    assert '"period": 5.0' in page and '"key": "{account}"' in page and "period_ms" not in page

    # Saved again as shown: no change, no new revision.
    response = admin_client.post(url("job", "change", "paced"), job_data(job, throttle=json.dumps(THROTTLE)))
    assert response.status_code == 302, form_errors(response)
    job.refresh_from_db()
    assert job.revision == 1

    changed = job_data(job, throttle='{"limit": 2, "period": 0.5}')
    response = admin_client.post(url("job", "change", "paced"), changed)
    assert response.status_code == 302, form_errors(response)
    job.refresh_from_db()
    assert (job.revision, job.throttle) == (2, {"limit": 2, "period_ms": 500, "burst": 0, "key": None})

    response = admin_client.post(url("job", "change", "paced"), job_data(job, throttle=""))
    assert response.status_code == 302, form_errors(response)
    job.refresh_from_db()
    assert (job.revision, job.throttle) == (3, None)


@pytest.mark.parametrize(
    ("throttle", "named"),
    [
        ('{"limit": 0, "period": 1}', "throttle.limit"),
        ('{"limit": 1}', "throttle.period"),
        ('{"limit": 1, "period": 1, "burst": -1}', "throttle.burst"),
        ('{"limit": 1, "period": 1, "key": "{a.b}"}', "throttle.key"),
        ('{"limit": 1, "period": 1, "rate": 2}', "throttle.rate"),
        ("[1, 2]", "throttle"),
        ("{not json", ""),
    ],
)
def test_a_bad_job_throttle_is_a_form_error_and_writes_nothing(admin_client, clock, throttle, named):
    job = scheduler.create_job("paced", "reports.send", authority=AUTHORITY)
    before = snapshot()
    response = admin_client.post(url("job", "change", "paced"), job_data(job, throttle=throttle))
    assert response.status_code == 200
    errors = form_errors(response)
    assert list(errors) == ["throttle"]
    assert named in errors["throttle"][0]
    assert snapshot() == before


def test_a_policy_throttle_is_set_shown_and_in_the_history(admin_client, policy):  # noqa: F811
    data = policy_data(policy, throttle='{"limit": 10, "period": 60, "burst": 2}')
    response = admin_client.post(url("authoritypolicy", "change", policy.pk), data)
    assert response.status_code == 302, form_errors(response)
    policy.refresh_from_db()
    assert (policy.revision, policy.throttle) == (
        2,
        {"limit": 10, "period_ms": 60_000, "burst": 2, "key": None},
    )
    response = admin_client.get(url("authoritypolicy", "change", policy.pk))
    page = unescape(response.content.decode())
    assert '"period": 60.0' in page and '"burst": 2' in page
    newest = response.context["policy_history"][0]
    assert ("throttle", "None", '{"burst": 2, "limit": 10, "period": 60.0}') in newest["changes"]


@pytest.mark.parametrize(
    ("throttle", "named"),
    [
        ('{"limit": 10, "period": 60, "key": "{account}"}', "throttle.key"),
        ('{"limit": 10, "period": 0}', "throttle.period"),
        ('{"limit": "ten", "period": 60}', "throttle.limit"),
    ],
)
def test_a_bad_policy_throttle_is_a_form_error_and_writes_nothing(admin_client, policy, throttle, named):  # noqa: F811
    before = snapshot()
    data = policy_data(policy, throttle=throttle)
    response = admin_client.post(url("authoritypolicy", "change", policy.pk), data)
    assert response.status_code == 200
    errors = form_errors(response)
    assert list(errors) == ["throttle"]
    assert named in errors["throttle"][0]
    assert snapshot() == before
    assert AuthorityPolicy.objects.get(pk=policy.pk).throttle is None
