#!/usr/bin/env python3
"""Run the whole test matrix: ``python3 tests/run.py [--require-all] [--install-system-deps] [nox
arguments]``, e.g. ``python3 tests/run.py -s sqlite -- -k kernel``.

Standard library only, so that it runs on a machine with nothing but Python 3.11+: it creates
``.venv-nox`` with the pinned nox and uv, then runs nox on ``noxfile.py`` (the legs and checks
are there: ``-l`` lists them) with the other arguments. ``--require-all``: a leg that cannot run
(no server, no Python 3.12+) fails instead of being skipped. ``--install-system-deps``: the legs
apt-get install what they miss (libmariadb-dev and pkg-config, pgbouncer; root only).

The last line printed is ``N passed, M failed``, summed over the legs' JUnit reports. The exit
code is nox's, and 1 when a whole run (no nox arguments) ran no test.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import venv
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOOLS = ROOT / ".venv-nox"
PINS = ("nox==2026.10.20", "uv==0.13.9")
REPORTS = ROOT / ".nox-reports"  # noxfile.REPORTS
FLAGS = {"--require-all": "DSCH_REQUIRE_ALL", "--install-system-deps": "DSCH_INSTALL_SYSTEM_DEPS"}


def tools_python() -> Path:
    """``.venv-nox``'s Python, with PINS installed (once; again when they change)."""
    python, stamp = TOOLS / "bin" / "python", TOOLS / "pins.txt"
    if python.exists() and stamp.exists() and stamp.read_text() == "\n".join(PINS):
        return python
    print(f"[run.py] creating {TOOLS.name} with {' '.join(PINS)}", flush=True)
    shutil.rmtree(TOOLS, ignore_errors=True)
    try:
        venv.create(TOOLS, with_pip=True)
    except (OSError, subprocess.CalledProcessError) as exc:
        sys.exit(f"[run.py] cannot create {TOOLS}: {exc} (on Debian: apt-get install python3-venv)")
    pip = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", *PINS]
    if subprocess.call(pip) != 0:
        sys.exit(f"[run.py] pip install {' '.join(PINS)} failed")
    stamp.write_text("\n".join(PINS))
    return python


def counts() -> dict[str, int]:
    """passed, failed (errors too) and skipped tests over the JUnit reports in REPORTS."""
    found = {"passed": 0, "failed": 0, "skipped": 0}
    for report in sorted(REPORTS.glob("*.xml")):
        for case in ET.parse(report).iter("testcase"):
            tags = {child.tag for child in case}
            failed, skipped = bool(tags & {"failure", "error"}), "skipped" in tags
            found["failed" if failed else "skipped" if skipped else "passed"] += 1
    return found


def main(argv: list[str]) -> int:
    cut = argv.index("--") if "--" in argv else len(argv)
    env = dict(os.environ)
    for flag, name in FLAGS.items():
        if flag in argv[:cut]:
            env[name] = "1"
    args = [arg for arg in argv[:cut] if arg not in FLAGS] + argv[cut:]
    python = tools_python()
    shutil.rmtree(REPORTS, ignore_errors=True)
    cmd = [str(python), "-m", "nox", "-f", str(ROOT / "noxfile.py"), *args]
    print("[run.py] $ nox " + " ".join(cmd[4:]), flush=True)
    code = subprocess.call(cmd, cwd=ROOT, env=env)
    found = counts()
    if code == 0 and not args and not found["passed"] + found["failed"]:
        print("[run.py] no test ran: that is a failure")
        code = 1
    print(f"\n{found['passed']} passed, {found['failed']} failed, {found['skipped']} skipped", flush=True)
    return code


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except KeyboardInterrupt:
        sys.exit(130)
