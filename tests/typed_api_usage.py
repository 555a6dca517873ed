"""What a user's type checker sees of ``import django_durable_scheduler as scheduler``: the
package re-exports its API lazily, and its ``__init__.pyi`` gives the names their types. The
lint leg runs mypy on this file (never imported by a test). mypy's ``warn_unused_ignores``
fails on an ignore that silences nothing, so each ignored line below is a mistake that mypy
must see: were the names ``Any``, as a module ``__getattr__`` makes them, it would not."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import django_durable_scheduler as scheduler


def typed_calls() -> None:
    job = scheduler.create_job("nightly", "reports.build", trigger={"type": "cron", "expr": "0 3 * * *"})
    enqueued = scheduler.enqueue(job.job_id, scheduled_for=datetime.now(UTC), trigger_key="manual")
    occurrence, deduplicated = enqueued  # still a tuple
    flag: bool = enqueued.deduplicated or deduplicated
    status: str = occurrence.status
    verdict: str = scheduler.Verdict.AUTHORIZED
    envelope: scheduler.Envelope | None = job.authority
    del flag, status, verdict, envelope

    scheduler.enqueue(job.job_id, scheduled_for="tomorrow", trigger_key="x")  # type: ignore[arg-type]
    scheduler.create_job(42, "reports.build")  # type: ignore[arg-type]
    missing: scheduler.Envelope = {"schemaVersion": 1}  # type: ignore[typeddict-item]
    scheduler.enqueue_later(job.job_id)  # type: ignore[attr-defined]
    wrong: int = scheduler.enqueue(job.job_id, scheduled_for=0, trigger_key="x")  # type: ignore[assignment]
    del wrong, missing


@scheduler.handler("reports.build")
def build(ctx: scheduler.ExecutionContext) -> dict[str, Any]:
    ctx.report_progress(1, total=2, note="half")
    ctx.report_progress("half")  # type: ignore[arg-type]
    return {}
