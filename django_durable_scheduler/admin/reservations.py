"""Authority reservations in the admin: the units each occurrence holds against its
principal's budget, read-only (the kernel reserves and settles them)."""

from __future__ import annotations

from django.contrib import admin

from ..models import AuthorityReservation
from .base import ReadOnlyAdmin


@admin.register(AuthorityReservation)
class AuthorityReservationAdmin(ReadOnlyAdmin):
    list_display = [
        "occurrence_id_display",
        "job_id_display",
        "principal_type",
        "principal_id",
        "policy_revision",
        "window_started_at",
        "units",
        "status",
        "created_at",
        "settled_at",
    ]
    list_filter = ["status", "principal_type"]
    search_fields = ["=occurrence__occurrence_id", "=job__job_id", "principal_id"]

    @admin.display(description="occurrence", ordering="occurrence_id")
    def occurrence_id_display(self, obj: AuthorityReservation) -> str:
        return obj.occurrence_id

    @admin.display(description="job", ordering="job_id")
    def job_id_display(self, obj: AuthorityReservation) -> str:
        return obj.job_id
