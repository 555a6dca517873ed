"""The soak's clock (``DURABLE_SCHEDULER_CLOCK``): this host's time plus an offset that the
driver moves by rewriting one file, so that every worker process, the driver and the audit read
the same moved time. The file, named by ``DSCH_SOAK_CLOCK``, holds the offset in milliseconds;
it is read again only when it changes (one ``stat`` per reading)."""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

ENV = "DSCH_SOAK_CLOCK"
_cached: tuple[tuple[int, int] | None, int] = (None, 0)  # ((inode, mtime_ns), offset ms)


def offset_ms() -> int:
    """The offset the file holds now (0 while there is none)."""
    global _cached
    path = os.environ.get(ENV)
    if not path:
        return 0
    try:
        stat = os.stat(path)
    except FileNotFoundError:
        return 0
    key = (stat.st_ino, stat.st_mtime_ns)
    if _cached[0] != key:
        _cached = (key, int(Path(path).read_text().strip() or 0))
    return _cached[1]


def now() -> datetime:
    return datetime.now(UTC) + timedelta(milliseconds=offset_ms())


def move_to(path: Path, moment: datetime) -> int:
    """Set the clock of every process reading ``path`` to ``moment`` (from now on it runs at
    real speed from there); the new offset in ms. Replaced whole, so no reader sees half a file."""
    offset = round((moment - datetime.now(UTC)).total_seconds() * 1000)
    temporary = path.with_suffix(".tmp")
    temporary.write_text(str(offset))
    os.replace(temporary, path)
    return offset
