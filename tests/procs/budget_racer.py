"""A worker process for the budget race tests: claims occurrences in batches and, for each,
either reserves authority directly (``reserve``) or runs the worker's authorization
(``authorize``), or claims and authorizes in one transaction as the worker does
(``claim_authorized``; with ``hold``, what is runnable is left running instead of settled).
Prints one ``<outcome> <occurrence id>`` line per occurrence decided.

usage: python -m tests.procs.budget_racer OWNER MODE POLICY_REVISION BATCH [hold]
"""

from __future__ import annotations

import os
import sys
import time
from datetime import datetime

import django


def main() -> None:
    django.setup()
    from django_durable_scheduler import kernel
    from django_durable_scheduler.exceptions import AuthorityBudgetExhausted
    from django_durable_scheduler.kernel import claiming
    from django_durable_scheduler.kernel.authority import reservations

    owner, mode, revision, batch = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    hold = sys.argv[5:] == ["hold"]
    start_at = float(os.environ.get("START_AT", "0"))
    while time.time() < start_at:
        time.sleep(0.005)
    lines: list[str] = []
    empty = 0
    while empty < 3 and mode == "claim_authorized":
        got = claiming.claim_authorized(owner=owner, lease=600, limit=batch)
        if not got.claimed:
            empty += 1
            time.sleep(0.05)
            continue
        empty = 0
        for row in got.runnable:
            if not hold:
                kernel.settle(row.pk, owner=owner, fence=row.fence, outcome="succeeded", result=None)
            lines.append(f"reserved {row.pk}")
        lines += [f"{result.verdict} {row.pk}" for row, result in got.refused]
    while empty < 3 and mode != "claim_authorized":
        rows = kernel.claim_batch(owner=owner, lease=600, limit=batch)
        if not rows:
            empty += 1
            time.sleep(0.05)
            continue
        empty = 0
        for row in rows:
            if mode == "reserve":
                try:
                    reservations.reserve_authority(row.pk, policy_revision=revision, units=1)
                except AuthorityBudgetExhausted as exc:
                    until = datetime.fromisoformat(exc.details["windowEndsAt"])
                    kernel.defer(row.pk, owner=owner, fence=row.fence, until=until, details=exc.details)
                    lines.append(f"exhausted {row.pk}")
                else:
                    lines.append(f"reserved {row.pk}")
            else:
                outcome = reservations.authorize(row, units=1, owner=owner)
                if outcome in (reservations.RESERVED, reservations.REUSED):
                    kernel.settle(row.pk, owner=owner, fence=row.fence, outcome="succeeded", result=None)
                lines.append(f"{outcome} {row.pk}")
    sys.stdout.write("".join(line + "\n" for line in lines))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
