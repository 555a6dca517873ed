#!/usr/bin/env python3
"""Run the whole test matrix: ``python3 tests/run.py [--require-all] [--install-system-deps] [nox
arguments]``, e.g. ``python3 tests/run.py -s sqlite -- -k kernel`` (``-l`` lists the sessions).

Standard library only: it makes ``.venv-nox`` with the pinned nox and uv, then runs nox on
``noxfile.py``. With no nox arguments it runs every session, in the noxfile's two lanes side by
side (one nox run leaves a two-core machine half idle at times). ``--require-all``: a leg
that cannot run fails instead of being skipped; ``--install-system-deps``: the legs apt-get
install what they miss (root only). The last line is ``N passed, M failed, K skipped`` over the
legs' JUnit reports; the exit code is nox's, and 1 when a whole run ran no test.
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


def side_by_side(nox: list[str], env: dict[str, str]) -> int:
    """The two lanes of ``noxfile.py`` side by side (two nox runs, each printed whole when it
    ends); the first non-zero exit code of the two, else 0."""
    lanes = {}
    for tag in ("lane-a", "lane-b"):
        log = (REPORTS / f"nox-{tag}.log").open("w+")
        print(f"[run.py] $ nox -t {tag} > {log.name}  (printed when it ends)", flush=True)
        lanes[tag] = (subprocess.Popen([*nox, "-t", tag], cwd=ROOT, env=env, stdout=log, stderr=log), log)
    codes = []
    for tag, (proc, log) in lanes.items():
        codes.append(proc.wait())
        log.seek(0)
        print(f"\n[run.py] ===== nox -t {tag}: exit {codes[-1]} =====\n{log.read()}", flush=True)
    return next((code for code in codes if code), 0)


def main(argv: list[str]) -> int:
    cut = argv.index("--") if "--" in argv else len(argv)
    env = {**os.environ, **{name: "1" for flag, name in FLAGS.items() if flag in argv[:cut]}}
    args = [arg for arg in argv[:cut] if arg not in FLAGS] + argv[cut:]
    nox = [str(tools_python()), "-m", "nox", "-f", str(ROOT / "noxfile.py")]
    shutil.rmtree(REPORTS, ignore_errors=True)
    REPORTS.mkdir()
    if args:
        print("[run.py] $ nox " + " ".join(args), flush=True)
        code = subprocess.call([*nox, *args], cwd=ROOT, env=env)
    else:
        code = side_by_side(nox, env)
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
