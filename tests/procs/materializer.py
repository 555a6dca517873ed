"""A scheduler process for the materialization race test: materializes until the shared
clock reaches DSCH_CLOCK_END (epoch ms), with small random pauses to vary interleavings."""

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
    print(written)


if __name__ == "__main__":
    main()
