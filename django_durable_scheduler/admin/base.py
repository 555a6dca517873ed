"""What the model admins share: the read-only and the write-through-the-API bases, the
confirmation page of an action, applying an action row by row through the kernel, and the
message that reports what it did."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from django.contrib import admin, messages
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.db.models import QuerySet
from django.forms import ModelForm
from django.http import HttpRequest
from django.template.response import TemplateResponse

from ..exceptions import SchedulerError

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


class KernelActionsAdmin(ReadOnlyAdmin):
    """Read-only rows with actions that change them through the kernel (``permissions=
    ["manage"]``): the actions need Django's change permission on the model, although the
    admin never edits the rows' fields."""

    def has_manage_permission(self, request: HttpRequest) -> bool:
        opts = self.opts
        return request.user.has_perm(f"{opts.app_label}.change_{opts.model_name}")


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


def report(
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
    """Tell the user what an action did: how many rows it changed, how many it skipped and
    why, and the first few failures."""
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


def apply_each(
    modeladmin: admin.ModelAdmin[Any],
    request: HttpRequest,
    queryset: QuerySet[Any],
    apply: Callable[[str], Any],
    applies: tuple[str, ...],
    done_label: str,
    noun: str,
    plural: str = "",
) -> None:
    """``apply(pk)`` on each row of the selection in one of the ``applies`` statuses, through
    the kernel; the others are skipped, failures reported."""
    done = skipped = 0
    failures: list[str] = []
    for pk, status in queryset.values_list("pk", "status").iterator():
        if status not in applies:
            skipped += 1
            continue
        try:
            apply(pk)
            done += 1
        except SchedulerError as exc:
            failures.append(f"{pk}: {exc}")
    statuses = " or ".join(str(status) for status in applies)
    report(modeladmin, request, done, done_label, noun, skipped, f"not {statuses}", failures, plural)


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
