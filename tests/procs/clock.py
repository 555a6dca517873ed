"""A clock shared by test processes: starts at DSCH_CLOCK_T0 (epoch ms) at real time
DSCH_CLOCK_START (epoch s), then runs DSCH_CLOCK_SPEED times faster than real time, and
stops at DSCH_CLOCK_END (epoch ms) when that is set."""

from __future__ import annotations

import os
import time
from datetime import UTC, datetime, timedelta


def dilated() -> datetime:
    t0 = datetime.fromtimestamp(int(os.environ["DSCH_CLOCK_T0"]) / 1000, tz=UTC)
    elapsed = max(0.0, time.time() - float(os.environ["DSCH_CLOCK_START"]))
    now = t0 + timedelta(seconds=elapsed * float(os.environ["DSCH_CLOCK_SPEED"]))
    end = os.environ.get("DSCH_CLOCK_END")
    if end is not None:
        now = min(now, datetime.fromtimestamp(int(end) / 1000, tz=UTC))
    return now
