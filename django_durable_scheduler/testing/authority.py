"""``grant()``: give a principal capabilities (and a budget) in one line, through the public
policy API (``set_policy``), so that a test's runs are authorized, or refused as it wants."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from ..exceptions import InvalidArgument
from ..kernel.authority.policies import get_policy, set_policy
from ..models import AuthorityPolicy
from ..rules.authority import DEFAULT_MAX_RUNS, DEFAULT_MAX_UNITS, DEFAULT_WINDOW_MS, MAX_BUDGET, Principal
from ..rules.validation import normalize_int


def principal_of(value: Any) -> Principal:
    """A principal given as ``"type:id"``, ``(type, id)``, ``{"type", "id"}`` or a whole
    authority envelope (its ``principal``); ``InvalidArgument("principal")`` otherwise."""
    if isinstance(value, dict) and "principal" in value:
        value = value["principal"]
    if isinstance(value, str):
        kind, colon, name = value.partition(":")
        if not colon:
            raise InvalidArgument("principal", f"must be 'type:id', not {value!r}")
        value = (kind, name)
    return Principal.parse(value, "principal")


def grant(
    principal: Any,
    *capabilities: str,
    runs: int | None = None,
    units: int | None = None,
    window: float | timedelta | None = None,
    max_running: int | None = None,
    using: str | None = None,
) -> AuthorityPolicy:
    """Let ``principal`` (``"team:billing"``, a ``(type, id)`` pair, a principal dict or an
    authority envelope) use ``capabilities``: its policy is created, or widened to hold
    them too. ``runs`` / ``units``: the budget per ``window`` (default: one day; without
    them, no budget, or the policy's own); ``max_running``: runs at once.

    A run whose envelope requests a capability its principal was not granted is denied (it
    shows as ``denied`` in ``drain()``'s result); one over ``runs`` waits for the next window
    (``deferred``)."""
    who = principal_of(principal)
    if not capabilities:
        raise InvalidArgument("capabilities", "grant at least one capability")
    # Checked here, so that a bad value is named as the caller named it.
    runs = None if runs is None else normalize_int(runs, "runs", minimum=1, maximum=MAX_BUDGET)
    units = None if units is None else normalize_int(units, "units", minimum=1, maximum=MAX_BUDGET)
    current = get_policy(who.type, who.id, using=using)
    budget: tuple[timedelta, int | None, int | None, int | None]
    if current is None:
        held: list[str] = []
        budget = (timedelta(milliseconds=DEFAULT_WINDOW_MS), DEFAULT_MAX_RUNS, DEFAULT_MAX_UNITS, None)
    else:
        held = list(current.capabilities)
        window_now = timedelta(milliseconds=current.window_ms)
        budget = (window_now, current.max_runs, current.max_units, current.max_running)
    return set_policy(
        who.type,
        who.id,
        capabilities=held + [capability for capability in capabilities if capability not in held],
        window=budget[0] if window is None else window,
        max_runs=budget[1] if runs is None else runs,
        max_units=budget[2] if units is None else units,
        max_running=budget[3] if max_running is None else max_running,
        expected_revision=0 if current is None else current.revision,
        using=using,
    )
