"""One pytest run in its own process group, its output kept (or echoed) and its closing line read."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections import deque
from pathlib import Path

from .results import ANSI, TIMED_OUT, closing_line

# The pytest processes running now, so that Ctrl-C can stop them all.
RUNNING: set[subprocess.Popen[bytes]] = set()


def run_pytest(
    python: Path, env: dict[str, str], args: list[str], timeout: float, *, echo: bool, cwd: Path
) -> tuple[int, str, list[bytes]]:
    """Run pytest in its own process group; return (exit code, or TIMED_OUT after ``timeout`` s;
    pytest's closing line; its output).

    ``echo``: copy its output to ours as it comes (one leg at a time); otherwise keep it all and
    return it, for the caller to print whole when the part is over (parts side by side).
    """
    # The slowest tests of each part are listed, to keep the suite's time in view.
    cmd = [str(python), "-m", "pytest", "-p", "no:cacheprovider", "--durations=15"]
    if sys.stdout.isatty() and echo:
        cmd.append("--color=yes")
    cmd += args
    command_line = "$ " + " ".join(cmd)
    if echo:
        print(command_line, flush=True)
    proc = subprocess.Popen(
        cmd,
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,  # so a timeout or Ctrl-C can end its worker subprocesses too
    )
    RUNNING.add(proc)
    output: list[bytes] = [] if echo else [(command_line + "\n").encode()]
    tail: deque[str] = deque(maxlen=50)

    def pump() -> None:
        assert proc.stdout is not None
        for raw in iter(proc.stdout.readline, b""):
            if echo:
                sys.stdout.buffer.write(raw)
                sys.stdout.flush()
            else:
                output.append(raw)
            tail.append(ANSI.sub("", raw.decode(errors="replace")).strip())

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        code = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        output.append(f"\n[run.py] leg exceeded {timeout / 60:.0f} min: stopping it\n".encode())
        if echo:
            print(output[-1].decode().strip(), flush=True)
        stop_group(proc)
        code = TIMED_OUT
    finally:
        RUNNING.discard(proc)
    reader.join(timeout=10)
    return code, closing_line(tail), output


def stop_group(proc: subprocess.Popen[bytes], grace: float = 10) -> None:
    """Stop ``proc``'s process group: SIGINT, then SIGTERM, then SIGKILL, ``grace`` s apart."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=grace)
            return
        except subprocess.TimeoutExpired:
            continue


def stop_all() -> None:
    for proc in list(RUNNING):
        stop_group(proc)
