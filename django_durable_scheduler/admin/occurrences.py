"""Occurrences in the admin: read-only, found by id, job or kind without scanning the table,
with what Django calls a task's occurrence, its chain and batch, and the run-now, cancel and
retry actions, each confirmed first and applied through the kernel."""

from __future__ import annotations

import functools
from typing import Any

from django.contrib import admin, messages
from django.db.models import Q, QuerySet
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.utils.html import format_html_join

from .. import kernel
from ..db.counting import BoundedCountPaginator
from ..exceptions import SchedulerError
from ..models import ACTIVE_STATUSES, PENDING_STATUSES, Job, Occurrence, OccurrenceStatus
from ..rules.identity import canonical_json
from ..tasks.display import TaskView, task_view
from ..telemetry import tracing
from . import chainview
from .base import KernelActionsAdmin, apply_each, confirmation, report
from .progressview import progress_html

# What the cancel action applies to: a waiting occurrence is cancelled, a running one asked to stop.
CANCELLABLE = ACTIVE_STATUSES


class JobListFilter(admin.RelatedFieldListFilter):
    """The occurrences of one job, listed from the jobs table (the first
    :attr:`SHOWN` by id; search for another job's id), not from the occurrences."""

    SHOWN = 200

    def field_choices(self, field: Any, request: HttpRequest, model_admin: Any) -> list[tuple[str, Any]]:
        jobs = Job.objects.using(model_admin.get_queryset(request).db).order_by("job_id")
        return [(job_id, job_id) for job_id in jobs.values_list("job_id", flat=True)[: self.SHOWN]]


class OccurrenceTaskFields:
    """What Django calls a ``django.tasks`` task's occurrence (``tasks/display.py``): a list
    column, and read-only fields shown on a task's occurrence only."""

    task_fields = ["task_path", "task_status", "task_args", "task_kwargs", "task_errors"]

    @staticmethod
    def _task(obj: Occurrence) -> TaskView:
        view = task_view(obj, obj.job.kind)
        assert view is not None  # get_fields shows these for tasks only
        return view

    @admin.display(description="task (Django's status)")
    def task_summary(self, obj: Occurrence) -> str:
        view = task_view(obj, obj.job.kind)
        return "" if view is None else f"{view.path} ({view.status})"

    @admin.display(description="task")
    def task_path(self, obj: Occurrence) -> str:
        return self._task(obj).path

    @admin.display(description="task status")
    def task_status(self, obj: Occurrence) -> str:
        return self._task(obj).status

    @admin.display(description="args")
    def task_args(self, obj: Occurrence) -> str:
        return canonical_json(self._task(obj).args)

    @admin.display(description="kwargs")
    def task_kwargs(self, obj: Occurrence) -> str:
        return canonical_json(self._task(obj).kwargs)

    @admin.display(description="errors")
    def task_errors(self, obj: Occurrence) -> str:
        errors = self._task(obj).errors
        if not errors:
            return "-"
        return format_html_join(
            "", "<p><strong>{}</strong></p><pre>{}</pre>", ((path, text) for path, text in errors)
        )


class OccurrenceChainFields:
    """A chain's or a batch's occurrence shows its links in a section of their own
    (``chainview.py``): its predecessor, its follow-ups, its batch."""

    link_fields = [
        "predecessor",
        "declared_follow_ups",
        "follow_up_occurrences",
        "batch_link",
        "completes_batch",
    ]
    # The columns that section shows in words and links instead.
    LINK_COLUMNS = ("follow_ups", "caused_by", "cause", "batch")

    @staticmethod
    def links_of(obj: Occurrence) -> list[str]:
        """The rows of the chain and batch section that apply to ``obj``."""
        rows = []
        if obj.caused_by:
            rows += ["predecessor", "cause"]
        if obj.follow_ups:
            rows += ["declared_follow_ups", "follow_up_occurrences"]
        if obj.batch_id:
            rows.append("batch_link")
        if chainview.completed_batch_id(obj) is not None:
            rows += ["completes_batch", "cause"]
        return rows

    @admin.display(description="caused by")
    def predecessor(self, obj: Occurrence) -> str:
        return chainview.predecessor(obj)

    @admin.display(description="declared follow-ups")
    def declared_follow_ups(self, obj: Occurrence) -> str:
        return chainview.declared(obj.follow_ups)

    @admin.display(description="follow-ups enqueued")
    def follow_up_occurrences(self, obj: Occurrence) -> str:
        return chainview.follow_ups(obj)

    @admin.display(description="member of batch")
    def batch_link(self, obj: Occurrence) -> str:
        return chainview.batch_link(obj.batch_id, obj._state.db)

    @admin.display(description="callback of batch")
    def completes_batch(self, obj: Occurrence) -> str:
        return chainview.batch_link(chainview.completed_batch_id(obj), obj._state.db)


class OccurrenceActions(KernelActionsAdmin):
    """Run now, cancel and retry: each confirmed first (``base.confirmation``), then applied
    through the kernel to the selected occurrences it applies to."""

    actions = ["run_now", "cancel_occurrences", "retry_dead_lettered"]

    def _confirmed(
        self, request: HttpRequest, queryset: QuerySet[Occurrence], verb: str, applies: tuple[str, ...]
    ) -> TemplateResponse | None:
        """None once the user has confirmed; before that, the page that says how many
        occurrences the action applies to and how many it will skip. It posts the same
        selection back: the checked rows, or (``select_across``) everything the list's
        filters match, re-read when confirmed."""
        template = "admin/durable_scheduler/occurrence/confirm_action.html"
        return confirmation(self, request, queryset, verb, applies, template)

    def _each_pending(
        self,
        request: HttpRequest,
        queryset: QuerySet[Occurrence],
        apply: Any,
        reason: str,
        done_label: str,
        applies: tuple[str, ...] = PENDING_STATUSES,
    ) -> None:
        """``apply(occurrence_id, reason=...)`` on each occurrence of the selection in one of
        the ``applies`` statuses (``base.apply_each``)."""
        apply_reason = functools.partial(apply, reason=reason)
        apply_each(self, request, queryset, apply_reason, applies, done_label, "occurrence")

    @admin.action(description="Run selected occurrences now (queued or retry_wait)", permissions=["manage"])
    def run_now(self, request: HttpRequest, queryset: QuerySet[Occurrence]) -> TemplateResponse | None:
        if (page := self._confirmed(request, queryset, "run now", PENDING_STATUSES)) is not None:
            return page
        reason = f"run now in the admin by {request.user.get_username()}"
        self._each_pending(request, queryset, kernel.run_now, reason, "Made due now:")
        return None

    @admin.action(
        description="Cancel selected occurrences (queued or retry_wait; running ones are asked to stop)",
        permissions=["manage"],
    )
    def cancel_occurrences(
        self, request: HttpRequest, queryset: QuerySet[Occurrence]
    ) -> TemplateResponse | None:
        """A waiting occurrence is cancelled at once; a running one is asked to stop and
        ends cancelled once its worker stops it. The event names the user who asked."""
        if (page := self._confirmed(request, queryset, "cancel", CANCELLABLE)) is not None:
            return page
        user = request.user.get_username()
        reason = f"cancelled in the admin by {user}"
        apply = functools.partial(kernel.cancel, requested_by=user or None)
        self._each_pending(request, queryset, apply, reason, "Cancelled or asked to stop:", CANCELLABLE)
        return None

    @admin.action(description="Retry selected dead-lettered occurrences", permissions=["manage"])
    def retry_dead_lettered(
        self, request: HttpRequest, queryset: QuerySet[Occurrence]
    ) -> TemplateResponse | None:
        """A new occurrence of the same job with the same payload (trigger key
        ``retry:<original id>``): the dead letter stays as history. Retrying the same dead
        letter again, before the job changes, finds the same new occurrence."""
        dead = (OccurrenceStatus.DEAD_LETTER,)
        if (page := self._confirmed(request, queryset, "retry", dead)) is not None:
            return page
        done = skipped = again = 0
        failures: list[str] = []
        for occurrence_id, status in queryset.values_list("occurrence_id", "status").iterator():
            if status != OccurrenceStatus.DEAD_LETTER:
                skipped += 1
                continue
            try:
                _, deduplicated = kernel.retry_dead_letter(occurrence_id)
            except SchedulerError as exc:
                failures.append(f"{occurrence_id}: {exc}")
                continue
            if deduplicated:
                again += 1
            else:
                done += 1
        report(
            self,
            request,
            done,
            "Enqueued a retry of",
            "dead-lettered occurrence",
            skipped,
            "not dead-lettered",
            failures,
        )
        if again:
            self.message_user(
                request, f"{again} had already been retried (the existing retry was kept).", messages.INFO
            )
        return None


@admin.register(Occurrence)
class OccurrenceAdmin(OccurrenceTaskFields, OccurrenceChainFields, OccurrenceActions):
    list_display = [
        "occurrence_id",
        "job_id_display",
        "kind",
        "status",
        "progress_summary",
        "task_summary",
        "attempt_display",
        "scheduled_for",
        "available_at",
        "trigger_key",
        "lease_owner",
        "settled_at",
    ]
    # The choices come from the jobs table and the code, never from the occurrences.
    list_filter = [
        "status",
        # A disabled job's pending occurrences wait unclaimed: find them here, cancel or keep them.
        ("job__enabled", admin.BooleanFieldListFilter),
        ("job__kind", admin.AllValuesFieldListFilter),
        ("job", JobListFilter),
    ]
    list_select_related = ["job"]
    # An occurrence id, a job id or a kind finds those exactly (get_search_results); any other
    # term searches trigger keys and error messages by substring.
    search_fields = ["trigger_key", "last_error__message"]
    search_help_text = (
        "An occurrence id, a job id or a kind (exactly), else part of a trigger key or error message."
    )
    # The claim index's order, read backwards: a page of millions of rows sorts nothing (each
    # status newest first; the status filter gives one status in due order, newest first).
    ordering = ["-status", "-available_at", "-lease_expires_at", "-scheduled_for", "-occurrence_id"]
    show_full_result_count = False
    paginator = BoundedCountPaginator
    show_facets = admin.ShowFacets.NEVER  # a count per choice would read every row

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Occurrence], search_term: str
    ) -> tuple[QuerySet[Occurrence], bool]:
        term = search_term.strip()
        if not term:
            return queryset, False
        if Occurrence.objects.using(queryset.db).filter(pk=term).exists():
            return queryset.filter(pk=term), False
        jobs = Job.objects.using(queryset.db).filter(Q(pk=term) | Q(kind=term))
        job_ids = list(jobs.values_list("pk", flat=True))
        if job_ids:
            return queryset.filter(job__in=job_ids), False
        return super().get_search_results(request, queryset, search_term)

    @admin.display(description="job", ordering="job_id")
    def job_id_display(self, obj: Occurrence) -> str:
        return obj.job_id

    @admin.display(description="kind", ordering="job__kind")
    def kind(self, obj: Occurrence) -> str:
        return obj.job.kind

    @admin.display(description="attempt")
    def attempt_display(self, obj: Occurrence) -> str:
        return f"{obj.attempt}/{obj.max_attempts}"

    readonly_fields = [
        *OccurrenceTaskFields.task_fields,
        "trace_id",
        "progress_summary",
        *OccurrenceChainFields.link_fields,
    ]

    def get_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        fields: list[Any] = []
        for name in super().get_fields(request, obj):
            if name == "progress":  # shown as a bar and its text
                fields.append("progress_summary")
            elif name not in self.readonly_fields:
                fields.append(name)
            if name == "trace_context":
                fields.append("trace_id")
        if obj is not None and task_view(obj, obj.job.kind) is not None:
            return [*self.task_fields, *fields]
        return fields

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        fields = [name for name in self.get_fields(request, obj) if name not in self.LINK_COLUMNS]
        if obj is None or not chainview.has_links(obj):
            return [(None, {"fields": fields})]
        return [(None, {"fields": fields}), ("Chain and batch", {"fields": self.links_of(obj)})]

    @admin.display(description="progress")
    def progress_summary(self, obj: Occurrence) -> str:
        """The handler's last progress report (``ctx.report_progress``): a bar and
        ``done / total (pct%) note``; empty if it reported none."""
        return progress_html(obj.progress, obj.fence)

    @admin.display(description="trace id")
    def trace_id(self, obj: Occurrence) -> str:
        """The enqueuer's trace (``trace_context``'s traceparent): what to search the tracing
        backend for; empty when the enqueue had no span."""
        return tracing.trace_id(obj.trace_context)
