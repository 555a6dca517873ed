"""The worker behind ``manage.py runscheduler``: the loop (:mod:`.loop`) and its parts.

It writes occurrence state only through the kernel; what it holds, runs, renews and settles
each has a module here.
"""

from __future__ import annotations

from .loop import EXIT_STUCK, Waker, Worker, claim_ahead, default_worker_id, log_fields

__all__ = ["EXIT_STUCK", "Waker", "Worker", "claim_ahead", "default_worker_id", "log_fields"]
