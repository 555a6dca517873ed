"""The dashboard page in the admin, in place of a list; its figures come from ``dashboard``."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse

from ..models import SchedulerDashboard
from . import dashboard
from .base import ReadOnlyAdmin


@admin.register(SchedulerDashboard)
class DashboardAdmin(ReadOnlyAdmin):
    """The dashboard page, in place of a list: what ran per kind, how late work is, the
    workers, budget use and the last day's dead letters. Needs only the view permission on
    occurrences, and refreshes itself."""

    REFRESH_SECONDS = 5

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        if request.user.has_perm("durable_scheduler.view_occurrence"):
            return True
        return bool(super().has_view_permission(request, obj))

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        board = dashboard.collect()
        context = {
            **self.admin_site.each_context(request),
            "title": "Scheduler dashboard",
            "opts": self.model._meta,
            "board": board,
            "charts": board.charts(),
            "workers": board.workers(),
            # The cancel action's own confirmation page follows the button.
            "can_cancel": request.user.has_perm("durable_scheduler.change_occurrence"),
            "chart_width": dashboard.LABEL_WIDTH + dashboard.BAR_WIDTH + 40,
            "refresh": self.REFRESH_SECONDS,
            "batches_shown": dashboard.BATCHES_SHOWN,
            **(extra_context or {}),
        }
        return TemplateResponse(request, "admin/durable_scheduler/dashboard.html", context)
