"""What each check and leg came to, the summary table and the last line CI reads."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from .legs import Part

ANSI = re.compile(r"\x1b\[[0-9;]*m")
# pytest's closing line, e.g. "==== 1 failed, 12 passed, 1 skipped in 3.21s ====" (or without "=" under -q).
SUMMARY_LINE = re.compile(r"^=*\s*(?P<body>.*\bin [\d.]+s\b.*?)\s*=*$")
COUNT = re.compile(r"(\d+) (passed|failed|errors?|skipped|xfailed|xpassed|deselected)\b")
# The counts that show a test ran (a run of deselected tests only ran none).
RAN = ("passed", "failed", "error", "skipped", "xfailed", "xpassed")
# pytest's exit codes: a timeout is ours (process.run_pytest), 5 is "no tests collected".
TIMED_OUT = -1
NO_TESTS = 5


@dataclass
class Result:
    name: str
    python: str = "-"
    django: str = "-"
    database: str = "-"
    status: str = "skipped"  # passed, failed or skipped
    why: str = ""
    seconds: float = 0.0
    counts: dict[str, int] = field(default_factory=dict)

    @property
    def result_text(self) -> str:
        counts = ", ".join(f"{n} {k}" for k, n in self.counts.items() if k != "deselected")
        details = "; ".join(text for text in (counts, self.why) if text)
        return f"{self.status} ({details})" if details else self.status

    def add_why(self, why: str) -> None:
        self.why = f"{self.why}; {why}" if self.why else why


def closing_line(lines: Iterable[str]) -> str:
    """The body of the last pytest closing line among ``lines`` (colours removed), or ""."""
    found = ""
    for line in lines:
        match = SUMMARY_LINE.match(ANSI.sub("", line).strip())
        if match:
            found = match["body"]
    return found


def parse_counts(closing: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    for number, word in COUNT.findall(closing):
        key = "error" if word.startswith("error") else word
        counts[key] = counts.get(key, 0) + int(number)
    return counts


def record(result: Result, part: Part, code: int, closing: str, seconds: float, timeout_min: float) -> bool:
    """Add one pytest run (a whole leg, or one of its parts) to the leg's result; whether it passed."""
    result.seconds += seconds
    for key, number in parse_counts(closing).items():
        result.counts[key] = result.counts.get(key, 0) + number
    # A part may select nothing (-k, a leg without server-restart tests); the whole leg may not.
    passed = code == 0 or (code == NO_TESTS and part.share)
    if not passed:
        if code == TIMED_OUT:
            why = f"timed out after {timeout_min:.0f} min"
        else:
            why = "no tests collected" if code == NO_TESTS else f"pytest exit {code}"
        if closing:
            why = f"{why}; {closing}"
        result.add_why(f"{part.title.strip(' ()')}: {why}" if part.share else why)
    if result.status != "failed":
        result.status = "passed" if passed else "failed"
    return passed


def settle(results: list[Result], *, require_all: bool) -> None:
    """Fail a leg that passed without running a test, and with ``require_all`` one that was skipped."""
    for result in results:
        if result.status == "passed" and not any(result.counts.get(k) for k in RAN):
            result.status = "failed"
            result.why = f"no tests collected; {result.why}" if result.why else "no tests collected"
        if require_all and result.status == "skipped":
            result.status = "failed"
            result.why = f"required: {result.why}"


def failures(checks: list[Result], results: list[Result]) -> list[str]:
    """The names of what failed; a run where no leg ran is a failure too."""
    failed = [r.name for r in checks + results if r.status == "failed"]
    if all(r.status == "skipped" for r in results):
        failed.append("(no leg ran)")
    return failed


def final_line(results: list[Result]) -> str:
    """``N passed, M failed`` over the legs (errors count as failed): the line CI reads."""
    passed = sum(r.counts.get("passed", 0) for r in results)
    failed = sum(r.counts.get("failed", 0) + r.counts.get("error", 0) for r in results)
    return f"{passed} passed, {failed} failed"


def table(rows: list[Result], title: str) -> str:
    headers = ("leg", "python", "django", "database", "result", "duration")
    cells = [(r.name, r.python, r.django, r.database, r.result_text, f"{r.seconds:6.1f} s") for r in rows]
    widths = [max(len(h), *(len(row[i]) for row in cells)) for i, h in enumerate(headers)]
    lines = [title]
    for row in (headers, tuple("-" * w for w in widths), *cells):
        lines.append("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
    return "\n".join(lines)


def summary(checks: list[Result], results: list[Result], seconds: float) -> tuple[str, int]:
    """The summary's text, ending with the final line, and the exit code (1 on any failure)."""
    blocks = [table(checks, "checks")] if checks else []
    blocks += [table(results, "legs"), f"total {seconds:.1f} s"]
    failed = failures(checks, results)
    lines = ["[run.py] no leg ran: that is a failure"] if "(no leg ran)" in failed else []
    if failed:
        lines.append(f"FAILED: {', '.join(failed)}")
    lines.append(final_line(results))
    return "\n\n".join(blocks) + "\n" + "\n".join(lines), 1 if failed else 0
