"""Form fields the admin forms share: JSON as text, and a throttle as JSON text checked by
the API's own normalizer."""

from __future__ import annotations

import json
from typing import Any

from django import forms
from django.core.exceptions import ValidationError

from ..exceptions import InvalidArgument
from ..rules.throttles import stored_throttle


class JsonTextField(forms.JSONField):
    """JSON as text. Empty means the API's default (``{}`` trigger, null payload)."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("widget", forms.Textarea(attrs={"rows": 6, "cols": 80, "spellcheck": "false"}))
        super().__init__(**kwargs)

    def prepare_value(self, value: Any) -> Any:
        # Indented, so that an authority envelope is readable in the textarea.
        if isinstance(value, forms.fields.InvalidJSONInput):
            return value
        return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True, cls=self.encoder)


class ThrottleField(JsonTextField):
    """A throttle as JSON text, ``{"limit": 100, "period": 5, "burst": 20, "key": "{account}"}``
    (empty: none), checked by the API's own normalizer so the form refuses what the API would,
    naming the setting (``throttle.limit``). Shown with ``period`` in seconds."""

    def __init__(self, *, keyed: bool = True, **kwargs: Any) -> None:
        kwargs.setdefault("widget", forms.Textarea(attrs={"rows": 2, "cols": 80, "spellcheck": "false"}))
        kwargs.setdefault("required", False)
        super().__init__(**kwargs)
        self.keyed = keyed

    def prepare_value(self, value: Any) -> Any:
        if isinstance(value, dict) and "period_ms" in value:
            value = shown_throttle(value)
        return super().prepare_value(value)

    def clean(self, value: Any) -> Any:
        raw = super().clean(value)
        try:
            return stored_throttle(raw, "throttle", keyed=self.keyed)
        except InvalidArgument as exc:
            raise ValidationError(str(exc), code="invalid") from None

    def has_changed(self, initial: Any, data: Any) -> bool:
        try:
            return bool(stored_throttle(initial, keyed=self.keyed) != self.clean(data))
        except (ValidationError, InvalidArgument):
            return True


def shown_throttle(stored: dict[str, Any] | None) -> dict[str, Any] | None:
    """A stored throttle as a person writes one: ``period`` in seconds, no empty key or burst."""
    if stored is None:
        return None
    shown: dict[str, Any] = {"limit": stored["limit"], "period": stored["period_ms"] / 1000}
    if stored.get("burst"):
        shown["burst"] = stored["burst"]
    if stored.get("key") is not None:
        shown["key"] = stored["key"]
    return shown
