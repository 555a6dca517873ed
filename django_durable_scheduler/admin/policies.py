"""Authority policies in the admin: the policy form (saved with ``policies.set_policy``),
what a change would do to the principal's work, the principal's usage and revision history,
and the read-only list of policy revisions."""

from __future__ import annotations

import json
from typing import Any

from django.contrib import admin
from django.forms import BaseForm
from django.http import HttpRequest, HttpResponse
from django.utils.html import format_html_join

from ..exceptions import SchedulerError
from ..kernel.authority import binding, budgets, policies
from ..models import AuthorityPolicy, AuthorityPolicyRevision
from .base import ApiFormAdmin, ReadOnlyAdmin
from .fields import shown_throttle
from .forms import AuthorityPolicyForm, describe_window


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
        "throttle",
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
                (
                    "Policy",
                    {
                        "fields": [
                            *self._DISPLAY,
                            "max_runs",
                            "max_units",
                            "max_running",
                            "throttle",
                            "enabled",
                        ]
                    },
                ),
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
    "throttle": "throttle",
}


def _content_value(key: str, value: Any) -> str:
    if key == "window_ms" and isinstance(value, int) and value > 0:
        return describe_window(value)
    if isinstance(value, bool):
        return "yes" if value else "no"
    if key == "throttle" and isinstance(value, dict):
        return json.dumps(shown_throttle(value), sort_keys=True)
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


@admin.register(AuthorityPolicyRevision)
class AuthorityPolicyRevisionAdmin(ReadOnlyAdmin):
    list_display = ["principal_type", "principal_id", "revision", "changed_by", "changed_at"]
    list_filter = ["principal_type"]
    search_fields = ["principal_id", "changed_by"]
