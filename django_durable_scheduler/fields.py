"""The models' own field types: the migrations name them by their import path, as they do
the check constraints' expressions."""

from __future__ import annotations

from typing import Any

from django.db import models
from django.db.models.fields.json import KeyTransform

from .rules.authority import compact_envelope, expand_envelope


class EnvelopeField(models.JSONField):
    """An occurrence's authority snapshot: stored without the envelope's default members
    (a copy per occurrence, so they are most of its row) and read back whole, so every
    reader, the ORM's and the raw claim's alike, sees the normalized envelope."""

    def get_prep_value(self, value: Any) -> Any:
        return super().get_prep_value(compact_envelope(value))

    def from_db_value(self, value: Any, expression: Any, connection: Any) -> Any:
        value = super().from_db_value(value, expression, connection)
        # A key of the envelope (``values("authority__principal")``) is read as it is.
        return value if isinstance(expression, KeyTransform) else expand_envelope(value)
