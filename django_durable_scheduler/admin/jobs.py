"""Jobs in the admin: the job form (saved with ``kernel.create_job``/``update_job``), each
job's last outcome and recent occurrences, and the enable, disable, run-now, and pause and
resume (of their kinds) actions."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.contrib.admin.utils import quote
from django.db.models import OuterRef, QuerySet, Subquery
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import mark_safe

from .. import conf, kernel
from ..exceptions import SchedulerError
from ..models import Event, Job, Occurrence, OccurrenceStatus
from ..rules.triggers.descriptions import describe_trigger
from ..rules.validation import iso_ms
from . import dashboard, pauses
from .base import ApiFormAdmin, report
from .forms import JobForm


@admin.register(Job)
class JobAdmin(ApiFormAdmin):
    form = JobForm
    list_display = [
        "job_id",
        "kind",
        "trigger_words",
        "next_fire_at",
        "enabled",
        "revision",
        "last_outcome",
        "declared_in",
    ]
    list_filter = ["enabled", "kind", "declared_in"]
    search_fields = ["job_id", "kind"]
    actions = ["enable_jobs", "disable_jobs", "run_now", "pause_kinds", "resume_kinds"]
    ordering = ["job_id"]

    _EDIT = [
        "kind",
        "trigger",
        "payload",
        "authority",
        "then",
        "on_dead_letter",
        "enabled",
        "max_attempts",
        ("retry_base_delay", "retry_max_delay"),
        "timeout",
        ("concurrency", "concurrency_key"),
        "throttle",
        "loaded_revision",
    ]
    _INFO = [
        "revision",
        "trigger_words",
        "next_fire_at",
        "last_slot_at",
        "declared_in",
        "created_at",
        "updated_at",
    ]

    RECENT_SHOWN = 20
    # Events read per occurrence shown: a run writes about three.
    EVENTS_PER_OCCURRENCE = 4

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        if obj is None:
            return [(None, {"fields": ["job_id", *self._EDIT]})]
        recent = ("Recent occurrences", {"fields": ["recent_occurrences"]})
        if not self.has_change_permission(request, obj):
            view = [
                "kind",
                "trigger",
                "payload",
                "authority",
                "then",
                "on_dead_letter",
                "enabled",
                "max_attempts",
                "timeout_ms",
                "concurrency",
                "concurrency_key",
                "throttle",
            ]
            return [(None, {"fields": ["job_id", *view]}), ("Schedule", {"fields": self._INFO}), recent]
        return [(None, {"fields": ["job_id", *self._EDIT]}), ("Schedule", {"fields": self._INFO}), recent]

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        return () if obj is None else ["job_id", *self._INFO, "recent_occurrences"]

    @admin.display(description="latest")
    def recent_occurrences(self, obj: Job) -> str:
        """The job's occurrences with the newest events (an index range of the job's events,
        however long its history), with their outcomes, each linked to its page."""
        newest = (
            Event.objects.using(obj._state.db)
            .filter(job=obj, occurrence__isnull=False)
            .order_by("-event_id")
            .values_list("occurrence_id", flat=True)[: self.RECENT_SHOWN * self.EVENTS_PER_OCCURRENCE]
        )
        ids = list(dict.fromkeys(newest))[: self.RECENT_SHOWN]
        found = (
            Occurrence.objects.using(obj._state.db)
            .filter(pk__in=ids)
            .only(
                "occurrence_id",
                "status",
                "attempt",
                "max_attempts",
                "scheduled_for",
                "settled_at",
                "last_error",
            )
        )
        rows = sorted(found, key=lambda row: ids.index(row.pk))
        if not rows:
            return "none yet"
        cells = format_html_join(
            "",
            '<tr><td><a href="{}">{}</a></td><td>{}</td><td>{}/{}</td>'
            '<td style="white-space: nowrap">{}</td><td style="overflow-wrap: anywhere">{}</td></tr>',
            (
                (
                    reverse("admin:durable_scheduler_occurrence_change", args=[quote(row.pk)]),
                    row.pk[:12] + "…",
                    OccurrenceStatus(row.status).label,
                    row.attempt,
                    row.max_attempts,
                    f"{row.scheduled_for:%Y-%m-%d %H:%M:%S}",
                    dashboard.error_text(row)[:100] if row.last_error else "",
                )
                for row in rows
            ),
        )
        head = mark_safe(  # a constant
            "<tr><th>occurrence</th><th>status</th><th>attempt</th><th>scheduled for</th><th>error</th></tr>"
        )
        return format_html('<table class="dsch-recent" style="width: 100%">{}{}</table>', head, cells)

    def get_queryset(self, request: HttpRequest) -> QuerySet[Job]:
        # The occurrence of the job's newest event: one entry of the (job, event_id) index per
        # job, where the newest occurrence by creation would read and sort the job's history.
        newest_event = (
            Event.objects.filter(job=OuterRef(OuterRef("pk")), occurrence__isnull=False)
            .order_by("-event_id")
            .values("occurrence")[:1]
        )
        latest = Occurrence.objects.filter(pk=Subquery(newest_event)).values("status")[:1]
        queryset: QuerySet[Job] = super().get_queryset(request)
        return queryset.annotate(latest_status=Subquery(latest))

    @admin.display(description="trigger")
    def trigger_words(self, obj: Job) -> str:
        try:
            return describe_trigger(obj.trigger)
        except SchedulerError as exc:
            return f"invalid trigger ({exc})"

    @admin.display(description="last outcome", ordering="latest_status")
    def last_outcome(self, obj: Job) -> str:
        status = getattr(obj, "latest_status", None)
        return str(OccurrenceStatus(status).label) if status else "-"

    def _set_enabled(self, request: HttpRequest, queryset: QuerySet[Job], enabled: bool) -> None:
        done = skipped = 0
        failures: list[str] = []
        for job in queryset.only("job_id", "revision", "enabled"):
            if job.enabled == enabled:
                skipped += 1
                continue
            try:
                kernel.update_job(job.job_id, expected_revision=job.revision, enabled=enabled)
                done += 1
            except SchedulerError as exc:
                failures.append(f"{job.job_id}: {exc}")
        state = "enabled" if enabled else "disabled"
        report(self, request, done, state.capitalize(), "job", skipped, f"already {state}", failures)

    @admin.action(description="Enable selected jobs", permissions=["change"])
    def enable_jobs(self, request: HttpRequest, queryset: QuerySet[Job]) -> None:
        self._set_enabled(request, queryset, True)

    @admin.action(description="Disable selected jobs", permissions=["change"])
    def disable_jobs(self, request: HttpRequest, queryset: QuerySet[Job]) -> None:
        self._set_enabled(request, queryset, False)

    def has_pause_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.has_perm(pauses.PERMISSION))

    @admin.action(description="Pause the kinds of selected jobs (on every worker)", permissions=["pause"])
    def pause_kinds(self, request: HttpRequest, queryset: QuerySet[Job]) -> None:
        pauses.change_kinds(self, request, queryset.values_list("kind", flat=True), kernel.pause, "paused")

    @admin.action(description="Resume the kinds of selected jobs", permissions=["pause"])
    def resume_kinds(self, request: HttpRequest, queryset: QuerySet[Job]) -> None:
        pauses.change_kinds(self, request, queryset.values_list("kind", flat=True), kernel.resume, "resumed")

    @admin.action(description="Run selected jobs now", permissions=["change"])
    def run_now(self, request: HttpRequest, queryset: QuerySet[Job]) -> None:
        now = conf.now()
        key = f"admin-run:{iso_ms(now)}:{request.user.get_username()}"
        done = 0
        failures: list[str] = []
        for job_id in queryset.values_list("job_id", flat=True):
            try:
                kernel.enqueue(job_id, scheduled_for=now, trigger_key=key)
                done += 1
            except SchedulerError as exc:
                failures.append(f"{job_id}: {exc}")
        report(self, request, done, "Enqueued", "occurrence", failures=failures)
