"""Progress: a running handler's report of how far it has come, stored on its occurrence for
operators to see. Part of the kernel, the only writer of occurrence state: one UPDATE that
only the lease's holder at its fence can make (``record_progress`` in the lifecycle table),
so a worker that lost its lease never overwrites the newer attempt's progress. The worker
throttles the reports (``worker/progress.py``); this writes each one it is given.
"""

from __future__ import annotations

from typing import Any

from .. import conf
from ..db.dialect import write_transaction
from ..models import Occurrence
from ..rules.lifecycle import Action, lease_lost
from ..rules.progress import Progress, normalize_progress
from .settling import lease_args
from .transitions import held, writes
from .writing import writing


def record_progress(
    occurrence_id: str,
    *,
    owner: str,
    fence: int,
    done: Any,
    total: Any = None,
    note: Any = None,
    using: str | None = None,
) -> Progress:
    """Store ``done`` of ``total`` (None: unknown) with ``note`` as the running occurrence's
    progress, replacing the last report, and return it. Bad input raises ``InvalidArgument``
    naming the field; ``SCHEDULER_LEASE_LOST`` unless ``owner`` still holds the lease at
    ``fence``. Either way nothing is written."""
    occurrence_id, owner, fence = lease_args(occurrence_id, owner, fence)
    checked = normalize_progress(done, total, note)
    progress = Progress(checked.done, checked.total, checked.note, fence)
    now = conf.now()
    with write_transaction(using) as alias:
        rows = Occurrence.objects.using(alias).filter(held(owner, fence, now), pk=occurrence_id)
        with writing(Action.RECORD_PROGRESS):
            written = rows.update(**writes(Action.RECORD_PROGRESS, now, progress=progress.as_json()))
        if not written:
            # Only a refused write reads the row, to say why.
            current = Occurrence.objects.using(alias).filter(pk=occurrence_id).first()
            raise lease_lost(occurrence_id, current, owner, fence, now)
    return progress
