"""Worker heartbeats in the admin: which workers run, where, since when; read-only."""

from __future__ import annotations

from django.contrib import admin

from ..models import WorkerHeartbeat
from .base import ReadOnlyAdmin


@admin.register(WorkerHeartbeat)
class WorkerHeartbeatAdmin(ReadOnlyAdmin):
    list_display = ["worker_id", "hostname", "pid", "concurrency", "started_at", "last_seen_at", "stopped_at"]
    list_filter = ["hostname"]
