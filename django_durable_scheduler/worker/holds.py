"""Which principals this worker has seen held at their budget, and until when: so that a
spent budget is logged once per window at WARNING, however many claims it defers."""

from __future__ import annotations

import logging
from typing import Any

logger = logging.getLogger("django_durable_scheduler")


class BudgetHolds:
    """The window end each principal was last reported held until (one entry per principal
    that ever was: a later window replaces the earlier one)."""

    def __init__(self) -> None:
        self._until: dict[str, str] = {}

    def deferred(self, principal: str, details: dict[str, Any]) -> bool:
        """Record a claim of ``principal`` deferred by its budget (``details``: the refusal's,
        with ``windowEndsAt``); log the WARNING and return True when this window is new."""
        until = str(details.get("windowEndsAt", ""))
        if self._until.get(principal) == until:
            return False
        self._until[principal] = until
        logger.warning(
            "principal %s is held at its budget until %s (runs %s/%s, units %s/%s): its work waits",
            principal,
            until,
            details.get("usedRuns"),
            _limit(details.get("maxRuns")),
            details.get("usedUnits"),
            _limit(details.get("maxUnits")),
            extra={"principal": principal, "window_ends_at": until},
        )
        return True


def _limit(value: Any) -> str:
    return "no limit" if value is None else str(value)
