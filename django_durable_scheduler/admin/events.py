"""Events in the admin: the read-only history, found by occurrence id, job id or type."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest

from ..db.counting import BoundedCountPaginator
from ..models import Event, Job, Occurrence
from ..rules.events import EVENT_TYPES
from .base import ReadOnlyAdmin


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
