"""A scheduler process for the materialization race test: materializes until the shared
clock reaches DSCH_CLOCK_END (epoch ms), where it stops, with small random pauses to vary
interleavings; then until a pass finds nothing due, so that the slots a slow machine left
behind are fired too (the others race for them just the same)."""

from __future__ import annotations

import os
import random
import time

import django


def main() -> None:
    django.setup()
    from django_durable_scheduler import conf, kernel

    end_ms = int(os.environ["DSCH_CLOCK_END"])
    written = 0
    while conf.now().timestamp() * 1000 < end_ms:
        written += kernel.materialize_due()
        time.sleep(random.uniform(0, 0.02))
    while wrote := kernel.materialize_due():
        written += wrote
    print(written)


if __name__ == "__main__":
    main()
