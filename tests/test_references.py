"""The repository explains itself: no code, test, page or template cites a document that is
not in it (a behavioural contract or source material kept elsewhere, or a path on the
machine it was written on). The design lives in ``docs/design.md``; a comment either says
its rule in a sentence or points there as ``docs/design.md, "<heading>"``.

No database: the files are read as text.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from .tree import reads_the_tree

ROOT = Path(__file__).resolve().parent.parent

pytestmark = reads_the_tree
SCANNED_DIRS = ("django_durable_scheduler", "tests", "bench", "docs", "example_project")
SCANNED_FILES = ("README.md", "CHANGELOG.md")
SUFFIXES = (".py", ".md", ".html")

REFERENCES = {
    # The old contract's name as a word, in capitals: "SPEC section 7", "the SPEC's order",
    # its file name. Lower-case "spec" (a variable, WorkerSpec) and SPECIAL do not match.
    "the contract document": re.compile(r"\bSPEC\b"),
    # The source material as a document: "the seed's v2", "this seed", "its seed identity".
    # Seeding data ("seed the example", "demo_seed", "a row seeded") and random seeds
    # ("seed = random...", "] seed 42") do not match.
    "the source material": re.compile(r"\b(?:the|this|its)\s+seeds?\b|\bseed's\b", re.IGNORECASE),
    # Paths that lead out of the repository to where those documents were kept, or that
    # name the machine's own directories.
    "a path outside the repository": re.compile(r"\.\./+(?:shared|seeds)\b|(?<![\w.])/work/"),
}

# Files whose references are listed, with their replacement text, in REFERENCES.md at the
# root of branch ``design``: other helpers were editing them when the rest were rewritten.


# This file quotes what the patterns catch, as their test cases.
SELF = "tests/test_references.py"


def _tracked() -> list[str]:
    """The scanned files git tracks, as paths relative to the root; outside a git checkout
    (an unpacked sdist) every such file on disk."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z", "--", *SCANNED_DIRS, *SCANNED_FILES],
            cwd=ROOT,
            capture_output=True,
            check=True,
        ).stdout.decode()
        paths = [path for path in listed.split("\0") if path]
    except (OSError, subprocess.CalledProcessError):
        paths = [name for name in SCANNED_FILES if (ROOT / name).is_file()]
        for top in SCANNED_DIRS:
            for folder, dirs, files in os.walk(ROOT / top):
                dirs[:] = [d for d in dirs if not d.startswith(".") and d != "__pycache__"]
                paths += [str((Path(folder) / name).relative_to(ROOT)) for name in files]
    return sorted(path for path in paths if path.endswith(SUFFIXES) and (ROOT / path).is_file())


def _references(path: str) -> list[str]:
    """``path:line: what: text`` for each reference in the file."""
    text = (ROOT / path).read_text(encoding="utf-8", errors="replace")
    found = []
    for what, pattern in REFERENCES.items():
        for match in pattern.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            found.append(f"{path}:{line}: {what}: {text.splitlines()[line - 1].strip()}")
    return found


def test_scans_the_repository() -> None:
    files = _tracked()
    for expected in ("README.md", "django_durable_scheduler/models.py", "tests/conftest.py"):
        assert expected in files


def test_no_reference_outside_the_repository() -> None:
    found = [hit for path in _tracked() if path != SELF for hit in _references(path)]
    assert not found, (
        "cite docs/design.md (or say the rule) instead of a document outside the repository:\n"
        + "\n".join(found)
    )


def test_patterns_are_precise() -> None:
    """What must be caught, and the legitimate words that must not be."""
    caught = [
        "(SPEC section 7)",
        "in the SPEC's order",
        "see SPEC.md",
        "The seed's nine event types",
        "Its ``code`` is the\nseed's string code",
        "a pure function of this seed",
        "with its seed identity",
        "read ../shared/notes.md",
        "at /work/shared/x",
    ]
    fine = [
        "spec = importlib.util.spec_from_file_location(name, path)",
        "class WorkerSpec:",
        "SPECIAL: list[Any] = []",
        "migrate and seed the example",
        "manage.py demo_seed",
        "a row seeded before the migration",
        'seed = step(original, url, "seed")',
        'print(f"[kill -9] seed {seed}")',
        '"../etc/passwd"',
        "https://example.com/work/page",
        "https://semver.org/spec/v2.0.0.html",
    ]
    for text in caught:
        assert any(p.search(text) for p in REFERENCES.values()), text
    for text in fine:
        assert not any(p.search(text) for p in REFERENCES.values()), text


# A merge's conflict markers, each alone at the start of its line.
CONFLICT_MARKER = re.compile(r"^(?:<{7}|>{7})(?: .*)?$|^={7}$", re.MULTILINE)


def test_no_merge_conflict_left() -> None:
    """A conflict resolved by committing both sides, markers included, reads as text to
    every other check (a README's code block, a comment): this one finds it."""
    found = [
        f"{path}:{text.count(chr(10), 0, match.start()) + 1}: {match.group(0)}"
        for path in _tracked()
        for text in [(ROOT / path).read_text(encoding="utf-8", errors="replace")]
        for match in CONFLICT_MARKER.finditer(text)
    ]
    assert not found, "merge conflict markers left in:\n" + "\n".join(found)
    assert CONFLICT_MARKER.search("a\n<<<<<<< HEAD\nb") and CONFLICT_MARKER.search("=======\n")
    assert not CONFLICT_MARKER.search("Title\n=========\n") and not CONFLICT_MARKER.search("x = 1  # =======")
