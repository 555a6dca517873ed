"""The benchmark's one handler, autodiscovered as this app's ``tasks`` module."""

from __future__ import annotations

import os
import time

import django_durable_scheduler as scheduler

from . import telemetry

KIND = "pgqueue.job"
_WORK_S = int(os.environ.get("JOB_WORK_MS", "1")) / 1000.0


@scheduler.handler(KIND)
def job(ctx):
    """Record the claim latency (the producer's stamp to now), then do the synthetic work."""
    telemetry.RECORDER.started(ctx.payload["created_at"])
    if _WORK_S:
        time.sleep(_WORK_S)
    telemetry.RECORDER.completed_one()
