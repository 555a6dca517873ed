#!/usr/bin/env python3
"""Build the documentation site: ``python3 docs/build.py [OUT]`` (default ``build/docs``).

Standard library only, from a fresh clone: it makes ``.venv-docs`` (or the directory
``DSCH_DOCS_VENV`` names) with this package and the docs tools of ``TOOLS`` once, then runs
``sphinx-build -W --keep-going -c docs . OUT`` in it. ``-W`` makes every warning an error: a
broken link, a missing anchor, a docstring that is not valid reStructuredText.
"""

from __future__ import annotations

import os
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOOLS = ("sphinx>=8", "myst-parser>=4", "furo>=2024.8")


def docs_python(where: Path) -> Path:
    """The Python of ``where``, a venv with the package and TOOLS (made once; again when they change)."""
    python, stamp = where / "bin" / "python", where / "tools.txt"
    wanted = "\n".join(TOOLS)
    if python.exists() and stamp.exists() and stamp.read_text() == wanted:
        return python
    print(f"[docs] creating {where} with the package and {' '.join(TOOLS)}", flush=True)
    venv.create(where, with_pip=True, clear=True)
    install = [
        str(python),
        "-m",
        "pip",
        "install",
        "-q",
        "--disable-pip-version-check",
        "-e",
        str(ROOT),
        *TOOLS,
    ]
    if subprocess.call(install) != 0:
        sys.exit("[docs] pip install failed")
    stamp.write_text(wanted)
    return python


def main() -> int:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "build" / "docs"
    python = docs_python(Path(os.environ.get("DSCH_DOCS_VENV") or ROOT / ".venv-docs"))
    build = [
        str(python),
        "-m",
        "sphinx",
        "-W",
        "--keep-going",
        "-q",
        "-b",
        "html",
        "-c",
        "docs",
        ".",
        str(out),
    ]
    code = subprocess.call(build, cwd=ROOT)
    if code == 0:
        print(f"[docs] built: {out / 'index.html'}")
    return code


if __name__ == "__main__":
    sys.exit(main())
