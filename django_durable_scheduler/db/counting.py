"""Counts on the pages a person opens: bounded, so that a list of millions of rows costs what a
list of thousands does. Below :data:`COUNT_BOUND` rows a list's count is exact; above it,
PostgreSQL's planner estimate (``dialect.planner_row_estimate``) and elsewhere the bound itself,
which still pages through the first ``COUNT_BOUND`` rows."""

from __future__ import annotations

from functools import cached_property
from typing import TYPE_CHECKING, Any

from django.core.paginator import Paginator
from django.db.models import QuerySet

from .dialect import planner_row_estimate

if TYPE_CHECKING:
    _Paginator = Paginator[Any]
else:  # Paginator is generic only in django-stubs
    _Paginator = Paginator

# Rows counted exactly at most: a count that reads this many index entries stays in milliseconds.
COUNT_BOUND = 10_000


def bounded_count(queryset: QuerySet[Any], bound: int = COUNT_BOUND) -> int:
    """The rows of ``queryset``: exact up to ``bound`` (it reads at most that many); above it
    the planner's estimate where the database gives one (never less than ``bound``), else
    ``bound``. Counting first keeps a stale estimate from putting a number on an empty list."""
    counted = queryset.order_by()[:bound].count()
    if counted < bound:
        return counted
    return max(bound, planner_row_estimate(queryset) or 0)


class BoundedCountPaginator(_Paginator):
    """The admin's paginator for the history tables: counts with :func:`bounded_count`."""

    @cached_property
    def count(self) -> int:
        if isinstance(self.object_list, QuerySet):
            return bounded_count(self.object_list)
        return len(self.object_list)
