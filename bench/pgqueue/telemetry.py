"""The adapter's side of the harness's JSONL protocol: counters, claim latencies, records.

Latencies are kept as counts per value rounded to 3 significant figures, one table per second
of the rolling 30 s window: memory is bounded at any rate (the contract asks for HDR-like
percentiles with 3 significant figures), and a percentile reads at most 30 small tables.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import sys
import threading
import time
from collections import Counter, deque

WINDOW_S = 30.0


def now_iso() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def instance_id() -> int:
    return int(os.environ.get("BENCH_INSTANCE_ID", "0") or 0)


class Recorder:
    """What the handler threads report (started, completed) and the producer (enqueued)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.enqueued = 0
        self.completed = 0
        self._slots: deque[tuple[int, Counter[float]]] = deque()

    def enqueued_n(self, n: int) -> None:
        with self._lock:
            self.enqueued += n

    def started(self, created_at: float) -> None:
        now = time.time()
        ms = float(f"{max(0.0, (now - created_at) * 1000.0):.3g}")
        second = int(time.monotonic())
        with self._lock:
            if not self._slots or self._slots[-1][0] != second:
                self._slots.append((second, Counter()))
                self._trim(second)
            self._slots[-1][1][ms] += 1

    def completed_one(self) -> None:
        with self._lock:
            self.completed += 1

    def percentiles(self, *quantiles: float) -> list[float]:
        """The claim latency at each quantile over the last WINDOW_S seconds (0 when none)."""
        merged: Counter[float] = Counter()
        with self._lock:
            self._trim(int(time.monotonic()))
            for _, counts in self._slots:
                merged.update(counts)
        total = sum(merged.values())
        if not total:
            return [0.0 for _ in quantiles]
        ordered = sorted(merged.items())
        found = []
        for q in quantiles:
            rank, seen = max(1, round(q * total)), 0
            for value, n in ordered:
                seen += n
                if seen >= rank:
                    found.append(value)
                    break
        return found

    def _trim(self, second: int) -> None:
        while self._slots and self._slots[0][0] <= second - WINDOW_S:
            self._slots.popleft()


RECORDER = Recorder()
_emit_lock = threading.Lock()


def emit(record: dict[str, object]) -> None:
    """One JSONL record on stdout, stamped with this replica's id as the harness expects."""
    record.setdefault("instance_id", instance_id())
    line = json.dumps(record)
    with _emit_lock:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()
