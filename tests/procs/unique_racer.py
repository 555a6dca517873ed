"""An enqueuer process for the unique-key race tests: enqueues ROUNDS rounds of one occurrence
per key, each under its own trigger key, with the keys ``k0``..``k<KEYS-1>`` as unique keys
(``unique``, ``active``) or debounced (``debounce``), and with ``claim`` also claims and settles
what is due between rounds. ``retry`` debounces too, but every process sends the same calls
(trigger key and payload without its name), as clients retrying each call at once. Prints one
``<unique key> <occurrence id> <deduplicated>`` line per enqueue.

usage: python -m tests.procs.unique_racer MODE NAME ROUNDS KEYS
"""

from __future__ import annotations

import os
import sys
import time

import django

BASE_MS = 1_700_000_000_000


def main() -> None:
    django.setup()
    from django_durable_scheduler import kernel

    mode, name, rounds, keys = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    options: dict[str, object] = {
        "unique": {},
        "active": {"unique_while": "active"},
        "claim": {},
        "debounce": {"debounce": 60},
        "retry": {"debounce": 60},
    }[mode]
    sender = "" if mode == "retry" else name
    start_at = float(os.environ.get("START_AT", "0"))
    while time.time() < start_at:
        time.sleep(0.005)
    lines: list[str] = []
    for round_ in range(rounds):
        for k in range(keys):
            occurrence, deduplicated = kernel.enqueue(
                "race",
                scheduled_for=BASE_MS,
                trigger_key=f"{sender}-{round_}-{k}",
                payload={"by": sender, "round": round_},
                unique_key=f"k{k}",
                **options,  # type: ignore[arg-type]
            )
            lines.append(f"k{k} {occurrence.pk} {int(deduplicated)}")
        if mode == "claim":
            for row in kernel.claim_batch(owner=name, lease=600, limit=keys):
                kernel.settle(row.pk, owner=name, fence=row.fence, outcome="succeeded")
    sys.stdout.write("".join(line + "\n" for line in lines))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
