"""``sync_declared_jobs()``: the jobs declared in code, made in the test database as
``runscheduler`` makes them when it starts (a test database starts without them)."""

from __future__ import annotations

from ..handlers import declared, registry


def sync_declared_jobs(using: str | None = None) -> dict[str, list[str]]:
    """Import the handler modules and create (or update) every job declared in code
    (``@handler(kind, job={...})``, ``declare_job``), as ``runscheduler`` does at its start;
    returns the job ids by what happened to them (``created``, ``updated``, ...)."""
    registry.autodiscover()
    return declared.sync_declared_jobs(using=using)
