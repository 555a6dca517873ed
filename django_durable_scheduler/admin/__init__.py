"""The scheduler in Django's admin.

Nothing here writes a scheduler table directly: policies are saved with
``policies.set_policy``, jobs with ``kernel.create_job``/``update_job``, and every action
goes through the kernel, so the admin gets the API's validation, revision checks and events.
Occurrences, events, usage, reservations, policy history and worker heartbeats are read-only;
so are batches, but for their close and cancel actions (``kernel.close_batch``/``cancel_batch``).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from django.conf import settings as django_settings
from django.contrib import admin, messages
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.admin.utils import quote
from django.core.exceptions import ImproperlyConfigured, PermissionDenied
from django.db.models import OuterRef, Q, QuerySet, Subquery
from django.forms import BaseForm, ModelForm
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.module_loading import import_string
from django.utils.safestring import mark_safe

from .. import conf, kernel
from ..db.counting import BoundedCountPaginator
from ..exceptions import SchedulerError
from ..kernel import binding, budgets, policies
from ..models import (
    ACTIVE_STATUSES,
    PENDING_STATUSES,
    TASK_SCHEDULE_PREFIX,
    AuthorityPolicy,
    AuthorityPolicyRevision,
    AuthorityReservation,
    AuthorityUsage,
    Batch,
    BatchStatus,
    Event,
    Job,
    Occurrence,
    OccurrenceStatus,
    SchedulerDashboard,
    TaskSchedule,
    WorkerHeartbeat,
)
from ..rules.events import EVENT_TYPES
from ..rules.identity import canonical_json
from ..rules.triggers import describe_trigger
from ..rules.validation import iso_ms
from ..tasks.display import TaskView, task_view
from ..telemetry import tracing
from . import chainview, dashboard
from .forms import AuthorityPolicyForm, JobForm, TaskScheduleForm, describe_window

if TYPE_CHECKING:
    _ModelAdmin = admin.ModelAdmin[Any]
else:  # ModelAdmin is generic only in django-stubs
    _ModelAdmin = admin.ModelAdmin


class ReadOnlyAdmin(_ModelAdmin):
    """Viewing only: these rows are written by the kernel and the worker."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class ApiFormAdmin(_ModelAdmin):
    """A change form whose form writes through the API while it validates (``forms._ApiForm``);
    the rest of the admin's save path (change message, admin log, redirect) stays Django's."""

    def get_form(
        self, request: Any, obj: Any = None, change: bool = False, **kwargs: Any
    ) -> type[ModelForm[Any]]:
        form = super().get_form(request, obj, change=change, **kwargs)
        attrs = {
            "changed_by": request.user.get_username() or None,
            "preview_only": request.method == "POST" and "_preview" in request.POST,
        }
        return type(form.__name__, (form,), attrs)

    def save_form(self, request: Any, form: Any, change: bool) -> Any:
        return form.saved if form.saved is not None else form.instance

    def save_model(self, request: Any, obj: Any, form: Any, change: bool) -> None:
        """Already saved by the form, through the API."""

    def save_related(self, request: Any, form: Any, formsets: Any, change: bool) -> None:
        """No inlines and no many-to-many fields."""

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # Deleting would bypass the API (and occurrences protect their job).
        return False


# What the cancel action applies to: a waiting occurrence is cancelled, a running one asked to stop.
CANCELLABLE = ACTIVE_STATUSES


def _report(
    modeladmin: admin.ModelAdmin[Any],
    request: HttpRequest,
    done: int,
    verb: str,
    noun: str,
    skipped: int = 0,
    skipped_why: str = "",
    failures: Iterable[str] = (),
    plural: str = "",
) -> None:
    failed = list(failures)
    parts = [f"{verb} {done} {noun if done == 1 else plural or noun + 's'}."]
    if skipped:
        parts.append(f"{skipped} skipped ({skipped_why}).")
    level = messages.SUCCESS if done and not failed else messages.INFO
    modeladmin.message_user(request, " ".join(parts), level)
    if failed:
        shown = failed[:10]
        more = f" (and {len(failed) - 10} more)" if len(failed) > 10 else ""
        modeladmin.message_user(request, f"{len(failed)} failed: " + "; ".join(shown) + more, messages.ERROR)


# --------------------------------------------------------------------------- policies


@admin.register(AuthorityPolicy)
class AuthorityPolicyAdmin(ApiFormAdmin):
    form = AuthorityPolicyForm
    change_form_template = "admin/durable_scheduler/authoritypolicy/change_form.html"
    list_display = [
        "principal_type",
        "principal_id",
        "revision",
        "enabled",
        "capability_summary",
        "window_display",
        "max_runs",
        "max_units",
        "max_running",
        "updated_at",
    ]
    list_filter = ["enabled", "principal_type"]
    search_fields = ["principal_id", "principal_type"]
    ordering = ["principal_type", "principal_id"]

    _EDIT = (
        "capabilities",
        ("window_value", "window_unit"),
        "max_runs",
        "max_units",
        "max_running",
        "enabled",
    )
    _DISPLAY = ("capability_lines", "window_display")

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        if obj is None:
            return [
                ("Principal", {"fields": ["principal_type", "principal_id"]}),
                ("Policy", {"fields": [*self._EDIT, "loaded_revision"]}),
            ]
        principal = ("Principal", {"fields": [("principal_type", "principal_id"), "revision", "updated_at"]})
        if not self.has_change_permission(request, obj):
            return [
                principal,
                ("Policy", {"fields": [*self._DISPLAY, "max_runs", "max_units", "max_running", "enabled"]}),
            ]
        return [principal, ("Policy", {"fields": [*self._EDIT, "loaded_revision"]})]

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        if obj is None:
            return ()
        return (
            "principal_type",
            "principal_id",
            "revision",
            "updated_at",
            "capability_lines",
            "window_display",
        )

    @admin.display(description="capabilities")
    def capability_summary(self, obj: AuthorityPolicy) -> str:
        caps = list(obj.capabilities)
        if len(caps) <= 3:
            return ", ".join(caps) or "(none)"
        return ", ".join(caps[:3]) + f" and {len(caps) - 3} more"

    @admin.display(description="capabilities")
    def capability_lines(self, obj: AuthorityPolicy) -> str:
        return format_html_join("", "{}<br>", ((cap,) for cap in obj.capabilities)) or "(none)"

    @admin.display(description="window", ordering="window_ms")
    def window_display(self, obj: AuthorityPolicy) -> str:
        return describe_window(obj.window_ms)

    def render_change_form(
        self,
        request: Any,
        context: dict[str, Any],
        add: bool = False,
        change: bool = False,
        form_url: str = "",
        obj: Any = None,
    ) -> HttpResponse:
        form = context["adminform"].form
        context.update(
            policy_usage=self._usage(obj),
            policy_preview=self._preview(form, obj),
            policy_history=self._history(obj),
            can_preview=add or self.has_change_permission(request, obj),
        )
        return super().render_change_form(request, context, add, change, form_url, obj)

    def _usage(self, obj: AuthorityPolicy | None) -> budgets.WindowUsage | None:
        return None if obj is None else budgets.current_usage(obj)

    def _preview(self, form: BaseForm, obj: AuthorityPolicy | None) -> dict[str, Any]:
        """What saving would do to the principal's jobs and pending occurrences: for the values
        in the form when it was submitted (Preview, or a failed save), else for the stored ones."""
        data = getattr(form, "cleaned_data", None) if form.is_bound else None
        capabilities: Any = None
        enabled: Any = None
        principal: tuple[Any, Any] | None = None
        if data is not None and "capabilities" in data and "enabled" in data:
            capabilities, enabled = data["capabilities"], data["enabled"]
            if obj is not None:
                principal = obj.principal_type, obj.principal_id
            elif data.get("principal_type") and data.get("principal_id"):
                principal = data["principal_type"], data["principal_id"]
            source = "the values in the form"
        elif obj is not None:
            capabilities, enabled = list(obj.capabilities), obj.enabled
            principal = obj.principal_type, obj.principal_id
            source = "the saved values"
        if principal is None:
            return {"available": False, "why": "Enter a principal and valid values, then preview."}
        try:
            counts = binding.preview_policy_change(
                principal[0], principal[1], capabilities=capabilities, enabled=enabled
            )
        except SchedulerError as exc:
            return {"available": False, "why": str(exc)}
        return {"available": True, "source": source, **counts}

    def _history(self, obj: AuthorityPolicy | None) -> list[dict[str, Any]]:
        if obj is None:
            return []
        rows = policies.policy_history(obj.principal_type, obj.principal_id, limit=50)
        return [revision_diff(row, rows[i + 1] if i + 1 < len(rows) else None) for i, row in enumerate(rows)]


_CONTENT_LABELS = {
    "enabled": "enabled",
    "window_ms": "window",
    "max_runs": "max runs",
    "max_units": "max units",
    "max_running": "max running",
}


def _content_value(key: str, value: Any) -> str:
    if key == "window_ms" and isinstance(value, int) and value > 0:
        return describe_window(value)
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


def revision_diff(row: AuthorityPolicyRevision, previous: AuthorityPolicyRevision | None) -> dict[str, Any]:
    """One history entry: what changed since ``previous`` (the revision before it), or, for
    the first revision shown, its full content."""
    content = row.content if isinstance(row.content, dict) else {}
    entry: dict[str, Any] = {
        "revision": row.revision,
        "changed_by": row.changed_by or "(system)",
        "changed_at": row.changed_at,
        "changes": [],
        "added": [],
        "removed": [],
        "initial": previous is None,
    }
    caps = [str(c) for c in content.get("capabilities") or []]
    if previous is None:
        entry["added"] = caps
        entry["changes"] = [
            (label, "", _content_value(key, content.get(key))) for key, label in _CONTENT_LABELS.items()
        ]
        return entry
    before = previous.content if isinstance(previous.content, dict) else {}
    old_caps = {str(c) for c in before.get("capabilities") or []}
    entry["added"] = sorted(set(caps) - old_caps)
    entry["removed"] = sorted(old_caps - set(caps))
    entry["changes"] = [
        (label, _content_value(key, before.get(key)), _content_value(key, content.get(key)))
        for key, label in _CONTENT_LABELS.items()
        if before.get(key) != content.get(key)
    ]
    return entry


# --------------------------------------------------------------------------- jobs


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
    actions = ["enable_jobs", "disable_jobs", "run_now"]
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
        _report(self, request, done, state.capitalize(), "job", skipped, f"already {state}", failures)

    @admin.action(description="Enable selected jobs", permissions=["change"])
    def enable_jobs(self, request: HttpRequest, queryset: QuerySet[Job]) -> None:
        self._set_enabled(request, queryset, True)

    @admin.action(description="Disable selected jobs", permissions=["change"])
    def disable_jobs(self, request: HttpRequest, queryset: QuerySet[Job]) -> None:
        self._set_enabled(request, queryset, False)

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
        _report(self, request, done, "Enqueued", "occurrence", failures=failures)


class TaskScheduleAdmin(JobAdmin):
    """The schedules of ``django.tasks`` tasks, in the task's terms. Registered when a
    ``DurableBackend`` is configured (``uses_durable_tasks``). A schedule declared in code
    (``tasks.schedule``) is shown, not edited: its code would undo the edit at the next sync."""

    form = TaskScheduleForm  # type: ignore[assignment]
    list_display = [
        "name",
        "task_path",
        "trigger_words",
        "next_fire_at",
        "enabled",
        "last_outcome",
        "declared_in",
    ]
    list_filter = ["enabled", "declared_in"]
    search_fields = ["job_id", "payload__task"]

    _EDIT = ["task", "trigger", "args", "kwargs", "enabled", "loaded_revision"]
    _SHOWN = ["job_id", "task_path", "trigger", "payload", "enabled", "kind", "authority"]

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        if obj is None:
            return [(None, {"fields": ["name", *self._EDIT]})]
        recent = ("Recent occurrences", {"fields": ["recent_occurrences"]})
        if not self.has_change_permission(request, obj):
            return [(None, {"fields": self._SHOWN}), ("Schedule", {"fields": self._INFO}), recent]
        return [(None, {"fields": ["job_id", *self._EDIT]}), ("Schedule", {"fields": self._INFO}), recent]

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        return () if obj is None else ["job_id", "task_path", *self._INFO, "recent_occurrences"]

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        if obj is not None and obj.declared_in:
            return False
        return super().has_change_permission(request, obj)

    @admin.display(description="name", ordering="job_id")
    def name(self, obj: Job) -> str:
        return obj.job_id.removeprefix(TASK_SCHEDULE_PREFIX)

    @admin.display(description="task")
    def task_path(self, obj: Job) -> str:
        payload = obj.payload if isinstance(obj.payload, dict) else {}
        return str(payload.get("task", "-"))


def uses_durable_tasks() -> bool:
    """Whether ``settings.TASKS`` has a ``DurableBackend`` (or a subclass); a project without
    ``TASKS`` imports no task framework."""
    configured = getattr(django_settings, "TASKS", None)
    if not isinstance(configured, dict) or not configured:
        return False
    try:
        from ..tasks.backend import DurableBackend
    except ImproperlyConfigured:  # TASKS without a framework: Django reports that itself
        return False
    for options in configured.values():
        try:
            backend = import_string(options["BACKEND"])
        except (ImportError, KeyError, TypeError):
            continue
        if isinstance(backend, type) and issubclass(backend, DurableBackend):
            return True
    return False


if uses_durable_tasks():
    admin.site.register(TaskSchedule, TaskScheduleAdmin)


# --------------------------------------------------------------------------- occurrences


class JobListFilter(admin.RelatedFieldListFilter):
    """The occurrences of one job, listed from the jobs table (the first
    :attr:`SHOWN` by id; search for another job's id), not from the occurrences."""

    SHOWN = 200

    def field_choices(self, field: Any, request: HttpRequest, model_admin: Any) -> list[tuple[str, Any]]:
        jobs = Job.objects.using(model_admin.get_queryset(request).db).order_by("job_id")
        return [(job_id, job_id) for job_id in jobs.values_list("job_id", flat=True)[: self.SHOWN]]


def confirmation(
    model_admin: admin.ModelAdmin[Any],
    request: HttpRequest,
    queryset: QuerySet[Any],
    verb: str,
    applies: tuple[str, ...],
    template: str,
    **extra: Any,
) -> TemplateResponse | None:
    """None once the user has confirmed an action; before that, ``template``: how many rows
    it applies to (those in a status of ``applies``) and how many it will skip, posting the same
    selection back (the checked rows, or with ``select_across`` what the filters match)."""
    if request.POST.get("post") == "yes":
        return None
    total = queryset.count()
    applicable = queryset.filter(status__in=applies).count()
    context = {
        **model_admin.admin_site.each_context(request),
        "title": "Are you sure?",
        "opts": model_admin.opts,
        "verb": verb,
        "statuses": " or ".join(str(status) for status in applies),
        "total": total,
        "applicable": applicable,
        "skipped": total - applicable,
        "action": request.POST.get("action", ""),
        "select_across": request.POST.get("select_across") == "1",
        "selected": request.POST.getlist(ACTION_CHECKBOX_NAME),
        "action_checkbox_name": ACTION_CHECKBOX_NAME,
        **extra,
    }
    return TemplateResponse(request, template, context)


@admin.register(Occurrence)
class OccurrenceAdmin(ReadOnlyAdmin):
    list_display = [
        "occurrence_id",
        "job_id_display",
        "kind",
        "status",
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
    actions = ["run_now", "cancel_occurrences", "retry_dead_lettered"]
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

    # A django.tasks task's occurrence also shows what Django calls it (tasks/display.py).
    task_fields = ["task_path", "task_status", "task_args", "task_kwargs", "task_errors"]
    # A chain's or a batch's occurrence shows them in a section of their own (chainview.py).
    link_fields = [
        "predecessor",
        "declared_follow_ups",
        "follow_up_occurrences",
        "batch_link",
        "completes_batch",
    ]
    readonly_fields = [*task_fields, "trace_id", *link_fields]
    # The columns that section shows in words and links instead.
    LINK_COLUMNS = ("follow_ups", "caused_by", "cause", "batch")

    def get_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        fields = []
        for name in super().get_fields(request, obj):
            if name not in self.readonly_fields:
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
        return [(None, {"fields": fields}), ("Chain and batch", {"fields": self._links_of(obj)})]

    @staticmethod
    def _links_of(obj: Occurrence) -> list[str]:
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

    @admin.display(description="trace id")
    def trace_id(self, obj: Occurrence) -> str:
        """The enqueuer's trace (``trace_context``'s traceparent): what to search the tracing
        backend for; empty when the enqueue had no span."""
        return tracing.trace_id(obj.trace_context)

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

    def has_manage_permission(self, request: HttpRequest) -> bool:
        """Cancelling and retrying change occurrences through the kernel: Django's change
        permission on the model, although the admin never edits an occurrence's fields."""
        opts = self.opts
        return request.user.has_perm(f"{opts.app_label}.change_{opts.model_name}")

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
        the ``applies`` statuses, through the kernel; the others are skipped, failures
        reported."""
        done = skipped = 0
        failures: list[str] = []
        for occurrence_id, status in queryset.values_list("occurrence_id", "status").iterator():
            if status not in applies:
                skipped += 1
                continue
            try:
                apply(occurrence_id, reason=reason)
                done += 1
            except SchedulerError as exc:
                failures.append(f"{occurrence_id}: {exc}")
        statuses = " or ".join(str(status) for status in applies)
        _report(self, request, done, done_label, "occurrence", skipped, f"not {statuses}", failures)

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
        _report(
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


# --------------------------------------------------------------------------- batches

# What each batch action applies to: close an open batch; cancel one not yet completed.
CLOSABLE = (BatchStatus.OPEN,)
BATCH_CANCELLABLE = (BatchStatus.OPEN, BatchStatus.CLOSED)


@admin.register(Batch)
class BatchAdmin(ReadOnlyAdmin):
    """Batches, read-only but for the close and cancel actions, which go through the kernel
    (``close_batch``, ``cancel_batch``); opened and filled through the API only."""

    change_form_template = "admin/durable_scheduler/batch/change_form.html"
    list_display = [
        "batch_id",
        "description",
        "status",
        "size",
        "created_by",
        "created_at",
        "completed_at",
        "cancelled",
    ]
    list_filter = ["status"]
    search_fields = ["=batch_id", "description"]
    search_help_text = "A batch id (exactly), else part of a description."
    actions = ["close_batches", "cancel_batches"]
    show_full_result_count = False
    paginator = BoundedCountPaginator
    show_facets = admin.ShowFacets.NEVER  # a count per choice would read every row
    fieldsets = [
        (
            None,
            {
                "fields": [
                    "batch_id",
                    "description",
                    "status",
                    "created_by",
                    "created_at",
                    "closed_at",
                    ("cancelled_at", "cancelled_by"),
                    "completed_at",
                ]
            },
        ),
        ("Progress", {"fields": ["size", "progress"]}),
        ("Callback", {"fields": ["callback_job_link", "callback_payload_display", "callback_link"]}),
    ]
    readonly_fields = ["progress", "callback_job_link", "callback_payload_display", "callback_link"]

    @admin.display(description="cancelled", boolean=True, ordering="cancelled_at")
    def cancelled(self, obj: Batch) -> bool:
        return obj.cancelled_at is not None

    @admin.display(description="members by outcome")
    def progress(self, obj: Batch) -> str:
        """Counted now while the batch runs (``kernel.batch_progress``); once completed, the
        counts it completed with (retention may prune its members after that)."""
        if obj.status == BatchStatus.COMPLETED:
            counts = obj.counts if isinstance(obj.counts, dict) else {}
        else:
            counts = kernel.batch_progress(obj.batch_id, using=obj._state.db)
        return chainview.progress_html(chainview.progress_of(obj, counts))

    @admin.display(description="callback job")
    def callback_job_link(self, obj: Batch) -> str:
        return format_html('<a href="{}">{}</a>', chainview.job_url(obj.callback_job_id), obj.callback_job_id)

    @admin.display(description="callback payload")
    def callback_payload_display(self, obj: Batch) -> str:
        if not obj.has_callback_payload:
            return "the job's own payload"
        return format_html("<code>{}</code>", canonical_json(obj.callback_payload))

    @admin.display(description="callback occurrence")
    def callback_link(self, obj: Batch) -> str:
        if obj.callback is None:
            return "enqueued when every member has ended" if obj.status != BatchStatus.COMPLETED else "-"
        return format_html('<a href="{}">{}</a>', chainview.occurrence_url(obj.callback), obj.callback)

    def has_manage_permission(self, request: HttpRequest) -> bool:
        """Closing and cancelling change batches through the kernel: Django's change
        permission on the model, although the admin never edits a batch's fields."""
        opts = self.opts
        return request.user.has_perm(f"{opts.app_label}.change_{opts.model_name}")

    def render_change_form(
        self,
        request: Any,
        context: dict[str, Any],
        add: bool = False,
        change: bool = False,
        form_url: str = "",
        obj: Any = None,
    ) -> HttpResponse:
        manage = obj is not None and self.has_manage_permission(request)
        context.update(
            can_close=manage and obj.status in CLOSABLE,
            can_cancel=manage and obj.status in BATCH_CANCELLABLE,
            action_checkbox_name=ACTION_CHECKBOX_NAME,
        )
        return super().render_change_form(request, context, add, change, form_url, obj)

    def _confirmed(
        self, request: HttpRequest, queryset: QuerySet[Batch], verb: str, applies: tuple[str, ...]
    ) -> TemplateResponse | None:
        """As the occurrences' actions ask: None once confirmed, else the page that says how
        many batches the action applies to (and where "no" goes back to, from a batch's page)."""
        template = "admin/durable_scheduler/batch/confirm_action.html"
        back_to = request.POST.get("_back_to", "")
        return confirmation(self, request, queryset, verb, applies, template, back_to=back_to)

    def _each(
        self,
        request: HttpRequest,
        queryset: QuerySet[Batch],
        apply: Any,
        applies: tuple[str, ...],
        done_label: str,
    ) -> HttpResponse | None:
        """``apply(batch_id)`` on each batch of the selection in one of the ``applies``
        statuses, through the kernel; the others are skipped, failures reported. Back to the
        batch's page when the action was asked for from there."""
        done = skipped = 0
        failures: list[str] = []
        for batch_id, status in queryset.values_list("batch_id", "status").iterator():
            if status not in applies:
                skipped += 1
                continue
            try:
                apply(batch_id)
                done += 1
            except SchedulerError as exc:
                failures.append(f"{batch_id}: {exc}")
        statuses = " or ".join(str(status) for status in applies)
        _report(self, request, done, done_label, "batch", skipped, f"not {statuses}", failures, "batches")
        back_to = request.POST.get("_back_to", "")
        if back_to and Batch.objects.using(queryset.db).filter(pk=back_to).exists():
            return HttpResponseRedirect(chainview.batch_url(back_to))
        return None

    @admin.action(description="Close selected batches (open: no more members)", permissions=["manage"])
    def close_batches(self, request: HttpRequest, queryset: QuerySet[Batch]) -> HttpResponse | None:
        """An open batch takes no more members and completes once every member has ended
        (at once if it has none)."""
        if (page := self._confirmed(request, queryset, "close", CLOSABLE)) is not None:
            return page
        return self._each(
            request,
            queryset,
            kernel.close_batch,
            CLOSABLE,
            "Closed (each completes, and its callback is enqueued, once its members have ended):",
        )

    @admin.action(
        description="Cancel selected batches (their waiting members are cancelled)", permissions=["manage"]
    )
    def cancel_batches(self, request: HttpRequest, queryset: QuerySet[Batch]) -> HttpResponse | None:
        """A batch not yet completed is closed and its waiting members cancelled; running
        ones finish as they will, then its callback runs with ``cancelled`` true. The
        batch and its event name the user who asked."""
        if (page := self._confirmed(request, queryset, "cancel", BATCH_CANCELLABLE)) is not None:
            return page
        user = request.user.get_username()
        apply = functools.partial(
            kernel.cancel_batch, reason=f"batch cancelled in the admin by {user}", requested_by=user or None
        )
        return self._each(
            request,
            queryset,
            apply,
            BATCH_CANCELLABLE,
            "Cancelled (waiting members cancelled, running ones finish; then the callback runs):",
        )


# --------------------------------------------------------------------------- read-only history and state


class EventTypeFilter(admin.AllValuesFieldListFilter):
    """The event types the code writes (``events.EVENT_TYPES``), not a scan of the events."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lookup_choices = list(EVENT_TYPES)  # type: ignore[assignment]  # any iterable serves


@admin.register(Event)
class EventAdmin(ReadOnlyAdmin):
    list_display = [
        "event_id",
        "occurred_at",
        "event_type",
        "job_id_display",
        "occurrence_id_display",
        "owner_id",
        "fence",
    ]
    list_filter = [("event_type", EventTypeFilter)]
    # An occurrence id or a job id finds its events (get_search_results); else by event type.
    search_fields = ["event_type"]
    search_help_text = "An occurrence id or a job id (exactly), else part of an event type."
    show_full_result_count = False
    paginator = BoundedCountPaginator
    show_facets = admin.ShowFacets.NEVER  # a count per choice would read every row

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Event], search_term: str
    ) -> tuple[QuerySet[Event], bool]:
        term = search_term.strip()
        if not term:
            return queryset, False
        if Occurrence.objects.using(queryset.db).filter(pk=term).exists():
            return queryset.filter(occurrence_id=term), False
        if Job.objects.using(queryset.db).filter(pk=term).exists():
            return queryset.filter(job_id=term), False
        return super().get_search_results(request, queryset, search_term)

    @admin.display(description="job", ordering="job_id")
    def job_id_display(self, obj: Event) -> str:
        return obj.job_id

    @admin.display(description="occurrence")
    def occurrence_id_display(self, obj: Event) -> str:
        return obj.occurrence_id or "-"


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


@admin.register(AuthorityPolicyRevision)
class AuthorityPolicyRevisionAdmin(ReadOnlyAdmin):
    list_display = ["principal_type", "principal_id", "revision", "changed_by", "changed_at"]
    list_filter = ["principal_type"]
    search_fields = ["principal_id", "changed_by"]


@admin.register(WorkerHeartbeat)
class WorkerHeartbeatAdmin(ReadOnlyAdmin):
    list_display = ["worker_id", "hostname", "pid", "concurrency", "started_at", "last_seen_at", "stopped_at"]
    list_filter = ["hostname"]


__all__ = [
    "AuthorityPolicyAdmin",
    "AuthorityPolicyRevisionAdmin",
    "AuthorityReservationAdmin",
    "AuthorityUsageAdmin",
    "BatchAdmin",
    "EventAdmin",
    "JobAdmin",
    "OccurrenceAdmin",
    "WorkerHeartbeatAdmin",
    "revision_diff",
]


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
