"""Batches in the admin: read-only, with their progress and callback, and the close and
cancel actions (``kernel.close_batch``/``cancel_batch``)."""

from __future__ import annotations

import functools
from typing import Any

from django.contrib import admin
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.utils.html import format_html

from .. import kernel
from ..db.counting import BoundedCountPaginator
from ..models import Batch, BatchStatus
from ..rules.identity import canonical_json
from . import chainview
from .base import KernelActionsAdmin, apply_each, confirmation

# What each batch action applies to: close an open batch; cancel one not yet completed.
CLOSABLE = (BatchStatus.OPEN,)
BATCH_CANCELLABLE = (BatchStatus.OPEN, BatchStatus.CLOSED)


@admin.register(Batch)
class BatchAdmin(KernelActionsAdmin):
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
        statuses (``base.apply_each``). Back to the batch's page when the action was asked
        for from there."""
        apply_each(self, request, queryset, apply, applies, done_label, "batch", "batches")
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
