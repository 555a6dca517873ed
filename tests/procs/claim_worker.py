"""A claiming process for the concurrency tests: claims in batches (a batch size of 0:
one ``claim()`` at a time) until nothing is due, settles each, and prints one claimed
occurrence id per line."""

from __future__ import annotations

import os
import sys
import time

import django


def main() -> None:
    django.setup()
    from django_durable_scheduler import kernel

    owner = sys.argv[1]
    batch = int(sys.argv[2])
    start_at = float(os.environ.get("START_AT", "0"))
    while time.time() < start_at:
        time.sleep(0.005)
    empty = 0
    while empty < 3:
        if batch:
            rows = kernel.claim_batch(owner=owner, lease=600, limit=batch)
        else:
            one = kernel.claim(owner=owner, lease=600)
            rows = [] if one is None else [one]
        if not rows:
            empty += 1
            time.sleep(0.05)
            continue
        empty = 0
        for row in rows:
            kernel.settle(row.pk, owner=owner, fence=row.fence, outcome="succeeded", result={"by": owner})
            print(row.pk, flush=False)
            # A handler's time between transactions, as a real worker has. Without it, three
            # processes looping back to back hold SQLite's write lock nearly all the time, and
            # a fourth waiting in SQLite's busy handler (which sleeps up to 100 ms between
            # tries) could first get the lock after 2.6 s, when nothing was left to claim.
            time.sleep(0.002)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
