"""Create the demo jobs (once) and enqueue a little work for them."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

import django_durable_scheduler as scheduler
from django_durable_scheduler import conf

AUTHORITY = {"principal": {"type": "service", "id": "demo"}, "requestedCapabilities": ["demo.run"]}
JOBS = {
    "demo-hello": {"kind": "demo.hello", "payload": {"name": "world"}},
    "demo-flaky": {"kind": "demo.flaky", "retry_base_delay": 2, "retry_max_delay": 10},
    "demo-fanout": {"kind": "demo.fanout"},
}
# Scheduled, not enqueued: every minute on Berlin wall-clock time.
CRON_JOBS = {
    "demo-berlin-minutely": {
        "kind": "demo.hello",
        "payload": {"name": "Berlin"},
        "trigger": {"cron": "* * * * *", "timezone": "Europe/Berlin"},
    },
}


class Command(BaseCommand):
    help = "Create the demo jobs if missing and enqueue one occurrence of each."

    def handle(self, *args: Any, **options: Any) -> None:
        # Every run is authorized against its principal's policy: give the demo one.
        policy = scheduler.ensure_policy(AUTHORITY, window=3600, max_runs=1000, max_units=1000)
        self.stdout.write(f"policy {policy} at revision {policy.revision}: {policy.capabilities}")
        for job_id, spec in {**JOBS, **CRON_JOBS}.items():
            try:
                scheduler.create_job(job_id, authority=AUTHORITY, **spec)
                self.stdout.write(f"created job {job_id}")
            except scheduler.Conflict:
                pass
        now = conf.now()
        for job_id in JOBS:
            occurrence, _ = scheduler.enqueue(
                job_id, scheduled_for=now, trigger_key=f"demo-seed:{now.isoformat()}"
            )
            self.stdout.write(f"enqueued {occurrence.occurrence_id[:16]}... for {job_id}")
