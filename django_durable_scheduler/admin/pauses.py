"""Paused kinds in the admin: the list, with the resume action, and the pause and resume that
the dashboard's control posts; each goes through ``kernel.pause``/``resume``, which record
it. Pausing and resuming need the change permission on paused kinds."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed, HttpResponseRedirect
from django.urls import URLPattern, path, reverse

from .. import kernel
from ..exceptions import SchedulerError
from ..models import PausedKind
from .base import KernelActionsAdmin, report

PERMISSION = "durable_scheduler.change_pausedkind"


def change_kinds(
    model_admin: admin.ModelAdmin[Any],
    request: HttpRequest,
    kinds: Iterable[str],
    change: Callable[..., bool],
    verb: str,
) -> None:
    """``change`` (``kernel.pause`` or ``resume``) each kind as the user; report what it did."""
    done = skipped = 0
    failures: list[str] = []
    for kind in sorted(set(kinds)):
        try:
            if change(kind, by=request.user.get_username() or None):
                done += 1
            else:
                skipped += 1
        except SchedulerError as exc:
            failures.append(f"{kind}: {exc}")
    report(model_admin, request, done, verb.capitalize(), "kind", skipped, f"already {verb}", failures)


@admin.register(PausedKind)
class PausedKindAdmin(KernelActionsAdmin):
    """The kinds no worker claims now. Rows are made and removed through the kernel only:
    by the dashboard's control, the jobs' pause and resume actions, and the resume here."""

    list_display = ["kind", "paused_at", "paused_by"]
    search_fields = ["kind"]
    actions = ["resume_kinds"]

    @admin.action(description="Resume selected kinds", permissions=["manage"])
    def resume_kinds(self, request: HttpRequest, queryset: QuerySet[PausedKind]) -> None:
        change_kinds(self, request, queryset.values_list("kind", flat=True), kernel.resume, "resumed")

    def get_urls(self) -> list[URLPattern]:
        name = f"{self.opts.app_label}_{self.opts.model_name}_pause_or_resume"
        view = self.admin_site.admin_view(self.pause_or_resume_view)
        return [path("pause-or-resume/", view, name=name), *super().get_urls()]

    def pause_or_resume_view(self, request: HttpRequest) -> HttpResponse:
        """The dashboard's control: POST ``kind`` and ``change`` (``pause`` or ``resume``),
        then back to the dashboard, with a message saying what happened."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        if not self.has_manage_permission(request):
            raise PermissionDenied
        change = request.POST.get("change")
        if change not in ("pause", "resume"):
            messages.error(request, f"change: must be pause or resume, not {change!r}")
        else:
            operation = kernel.pause if change == "pause" else kernel.resume
            kind = request.POST.get("kind", "")
            change_kinds(self, request, [kind], operation, f"{change}d")
        return HttpResponseRedirect(reverse("admin:durable_scheduler_schedulerdashboard_changelist"))
