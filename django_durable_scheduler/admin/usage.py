"""Authority usage in the admin: each principal's runs and units in its current window,
read-only (the kernel counts them)."""

from __future__ import annotations

from django.contrib import admin

from ..models import AuthorityUsage
from .base import ReadOnlyAdmin


@admin.register(AuthorityUsage)
class AuthorityUsageAdmin(ReadOnlyAdmin):
    list_display = [
        "principal_type",
        "principal_id",
        "policy_revision",
        "window_started_at",
        "runs",
        "units",
        "updated_at",
    ]
    list_filter = ["principal_type"]
    search_fields = ["principal_id"]
