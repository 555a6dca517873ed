"""A claiming process for the concurrency-limit race: from ``START_AT`` on, claims through the
worker's path (``claim_authorized``) ``ROUNDS`` times without settling anything, and prints
how many it got. Nobody settles, so every place a claim takes stays taken: the claims of all
racers together must come to exactly the limit."""

from __future__ import annotations

import os
import sys
import time

import django


def main() -> None:
    django.setup()
    from django_durable_scheduler.kernel import claiming

    owner = sys.argv[1]
    start_at = float(os.environ.get("START_AT", "0"))
    while time.time() < start_at:
        time.sleep(0.002)
    got = 0
    for _ in range(int(os.environ.get("ROUNDS", "10"))):
        got += len(claiming.claim_authorized(owner=owner, lease=600, limit=3).runnable)
    print(got, flush=True)


if __name__ == "__main__":
    main()
