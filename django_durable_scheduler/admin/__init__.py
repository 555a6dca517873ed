"""The scheduler in Django's admin, one module per model admin; importing this package (as
Django's admin autodiscovery does) registers them all.

Nothing here writes a scheduler table directly: policies are saved with
``policies.set_policy``, jobs with ``kernel.create_job``/``update_job``, and every action
goes through the kernel, so the admin gets the API's validation, revision checks and events.
Occurrences, events, usage, reservations, policy history and worker heartbeats are read-only;
so are batches, but for their close and cancel actions (``kernel.close_batch``/``cancel_batch``).

    base             what the model admins share: the read-only and write-through-the-API bases,
                     an action's confirmation page, applying it row by row, its report
    forms            the job, task schedule and policy forms, which save through the API
    policies         authority policies (with their usage, preview and history) and revisions
    jobs             jobs, their recent occurrences and the enable/disable/run-now actions, and
                     the pause/resume of their kinds
    pauses           the paused kinds, their resume, and the dashboard's pause control
    task_schedules   the schedules of django.tasks tasks (registered with a DurableBackend)
    occurrences      occurrences, their task, chain and batch fields, and their actions
    chainview        what an occurrence's and a batch's pages show of chains and batches
    batches          batches, their progress and callback, and the close and cancel actions
    events           the event history
    usage            authority usage per principal and window
    reservations     the units each occurrence holds against a budget
    workers          worker heartbeats
    dashboard_admin  the dashboard page
    dashboard        the dashboard's figures
"""

from __future__ import annotations

from . import (
    batches,
    dashboard_admin,
    events,
    jobs,
    occurrences,
    pauses,
    policies,
    reservations,
    task_schedules,
    usage,
    workers,
)

__all__ = [
    "batches",
    "dashboard_admin",
    "events",
    "jobs",
    "occurrences",
    "pauses",
    "policies",
    "reservations",
    "task_schedules",
    "usage",
    "workers",
]
