"""The dashboard page in the admin, in place of a list; its figures come from ``dashboard``."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse

from ..db.dialect import alias_for
from ..models import SchedulerDashboard
from . import dashboard, dashboard_charts, dashboard_series, pauses
from .base import ReadOnlyAdmin


@admin.register(SchedulerDashboard)
class DashboardAdmin(ReadOnlyAdmin):
    """The dashboard page, in place of a list: what ran per kind, and over time (``?range=``
    hour, day or week, ``&kind=`` one kind or all), how late work is, the workers, the paused
    kinds (with their pause and resume control), budget use and the last day's dead letters.
    Needs only the view permission on occurrences, and refreshes itself."""

    REFRESH_SECONDS = 5

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        if request.user.has_perm("durable_scheduler.view_occurrence"):
            return True
        return bool(super().has_view_permission(request, obj))

    def selection(self, request: HttpRequest, kinds: list[str], alias: str) -> tuple[str, str | None]:
        """The range and kind the query string asks for; a value the page does not know is
        replaced by the default, and a warning on the page says so (a mistyped link would
        otherwise show other figures than it seems to)."""
        span = request.GET.get("range") or dashboard_series.DEFAULT_RANGE
        if span not in dashboard_series.RANGES:
            *others, last = dashboard_series.RANGES
            known = f"{', '.join(others)} or {last}"
            span, asked = dashboard_series.DEFAULT_RANGE, span
            messages.warning(request, f'Unknown range "{asked}" ({known}): showing the last {span}.')
        kind = request.GET.get("kind") or None
        if kind is not None and kind not in kinds and not dashboard_series.kind_exists(kind, alias):
            messages.warning(request, f'No job has the kind "{kind}": showing every kind.')
            kind = None
        return span, kind

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        board = dashboard.collect()
        alias = alias_for(None)
        kinds = dashboard_series.kinds(alias)
        span, kind = self.selection(request, kinds, alias)
        timeline = dashboard_series.collect(span, kind, board.status.now, alias)
        context = {
            **self.admin_site.each_context(request),
            "title": "Scheduler dashboard",
            "opts": self.model._meta,
            "board": board,
            "charts": board.charts(),
            "workers": board.workers(),
            # The cancel action's own confirmation page follows the button.
            "can_cancel": request.user.has_perm("durable_scheduler.change_occurrence"),
            # The pause control lists the jobs' kinds not paused already.
            "can_pause": request.user.has_perm(pauses.PERMISSION),
            "pausable": sorted(set(kinds) - {p.kind for p in board.status.paused}),
            "chart_width": dashboard.LABEL_WIDTH + dashboard.BAR_WIDTH + 40,
            "refresh": self.REFRESH_SECONDS,
            "batches_shown": dashboard.BATCHES_SHOWN,
            # The charts over time, for the range and kind the query string selects.
            "timeline": timeline,
            "timeline_charts": dashboard_charts.charts(timeline),
            "ranges": list(dashboard_series.RANGES),
            "kinds": kinds,
            **(extra_context or {}),
        }
        return TemplateResponse(request, "admin/durable_scheduler/dashboard.html", context)
