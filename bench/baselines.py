"""Earlier commits of this package as extra systems of one bench/run.py run (``--baseline SHA``).

Standard library only, as bench/run.py. Each commit's ``django_durable_scheduler/`` is exported
once into ``.bench-baselines/<sha>/``; bench/suite.py then runs in a process of its own with that
copy ahead of the working tree on the path (one process cannot import two versions of a package),
on a database of its own that the commit's own migrations build, and its "ours" rows come back
labelled ``ours@<short sha>``. The working tree's rows stay "ours", and a "main vs <sha>" table
compares the plain figures of the two.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / ".bench-baselines"
PACKAGE = "django_durable_scheduler"
# The workloads that run in rounds, every commit once per repetition; the others (W4, pgbench,
# profile, scale) measure the working tree alone and run once after the rounds.
ROUND_WORKLOADS = ("w1", "w2", "w3")
# The plain figures compared between the working tree and each baseline.
PLAIN = (
    "W1 enqueue one-by-one",
    "W1 enqueue bulk",
    "W2 drain x1",
    "W2 drain x2",
    "W2 drain x1, matched concurrency",
    "W2 drain x2, matched concurrency",
    "W3 latency p50, default poll",
    "W3 latency p90, default poll",
    "W3 latency p50, poll 0.1 s",
    "W3 latency p90, poll 0.1 s",
)


@dataclass(frozen=True)
class Baseline:
    sha: str
    path: Path

    @property
    def short(self) -> str:
        return self.sha[:7]

    @property
    def label(self) -> str:
        return f"ours@{self.short}"

    def env(self) -> dict[str, str]:
        """What the suite process needs to import this commit's package, and to tell its workers to."""
        return {
            "BENCH_PACKAGE_DIR": str(self.path),
            "BENCH_COMMIT": self.sha,
            "PYTHONPATH": os.pathsep.join((str(self.path), str(ROOT))),
            "PYTHONSAFEPATH": "1",  # python -m would otherwise put the working tree first
        }

    def url(self, main_url: str) -> str:
        """The baseline's own database beside the working tree's: ``<name>_<short sha>``."""
        parts = urlsplit(main_url)
        if parts.scheme == "sqlite":
            folder, _, name = main_url.rpartition("/")
            stem, dot, suffix = name.rpartition(".")
            return f"{folder}/{stem}-{self.short}.{suffix}" if dot else f"{main_url}-{self.short}"
        return urlunsplit(parts._replace(path=f"{parts.path}_{self.short}"))


def resolve(revisions: list[str]) -> list[Baseline]:
    """Each revision as a commit, its package exported (once: the export is kept in the cache)."""
    found: list[Baseline] = []
    for rev in revisions:
        proc = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"],
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            raise SystemExit(f"--baseline {rev}: not a commit of this repository")
        sha = proc.stdout.strip()
        if any(b.sha == sha for b in found):
            continue
        found.append(Baseline(sha, export(sha)))
    return found


def export(sha: str) -> Path:
    """``.bench-baselines/<sha>/`` holding the commit's package, made unless already complete."""
    target = CACHE / sha
    done = target / ".complete"
    if done.exists():
        return target
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    archive = subprocess.Popen(["git", "-C", str(ROOT), "archive", sha, PACKAGE], stdout=subprocess.PIPE)
    untar = subprocess.run(["tar", "-x", "-C", str(target)], stdin=archive.stdout)
    if archive.wait() != 0 or untar.returncode != 0 or not (target / PACKAGE / "__init__.py").exists():
        raise SystemExit(f"could not export {PACKAGE}/ of {sha} into {target}")
    done.touch()
    return target


def order(baselines: list[Baseline], rep: int) -> list[Baseline | None]:
    """One round's order (None is the working tree), rotated each repetition so that no commit
    always runs first or last, when the machine may be at its fastest or slowest."""
    systems: list[Baseline | None] = [*baselines, None]
    shift = rep % len(systems)
    return systems[shift:] + systems[:shift]


# --------------------------------------------------------------------------- results


def combine(parts: list[tuple[Baseline | None, dict[str, Any]]]) -> dict[str, Any]:
    """The suite outputs of one database (rounds and the rest) as one: samples of the same row
    appended, the baselines' "ours" rows relabelled, their versions kept under ``baselines``."""
    into: dict[str, Any] = {"rows": [], "notes": [], "plans": {}, "baselines": {}}
    # The working tree's rows first (the table keeps this order), each sample list in run order.
    for baseline, data in sorted(parts, key=lambda part: part[0] is not None):
        for row in data.get("rows", []):
            if baseline is not None:
                if row["system"] != "ours":
                    continue
                row = {**row, "system": baseline.label}
            same = next(
                (r for r in into["rows"] if (r["workload"], r["system"]) == (row["workload"], row["system"])),
                None,
            )
            if same is None:
                into["rows"].append({**row, "samples": list(row["samples"]), "details": list(row["details"])})
            else:
                same["samples"] += row["samples"]
                same["details"] += row["details"]
        prefix = "" if baseline is None else f"{baseline.label}: "
        into["notes"] += [f"{prefix}{note}" for note in data.get("notes", [])]
        if baseline is not None:
            into["baselines"][baseline.label] = data.get("versions", {})
            continue
        into["plans"].update(data.get("plans", {}))
        for key, value in data.items():
            if key not in ("db", "rows", "notes", "plans") and (key not in into or value):
                into[key] = value
    if not into["baselines"]:
        del into["baselines"]
    return into


def comparison(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Main ("ours") against each ``ours@<sha>`` on every plain figure either has, per database:
    the ratio is above 1 when main is better; ``apart`` when the two ranges do not overlap;
    a figure one side lacks (its suite failed) is listed with ``missing``."""
    out = []
    labels = sorted({r["system"] for r in rows if r["system"].startswith("ours@")})
    for db in dict.fromkeys(r["db"] for r in rows):
        for label in labels:
            for workload in PLAIN:
                main = _row(rows, db, workload, "ours")
                base = _row(rows, db, workload, label)
                if main is not None or base is not None:
                    out.append({"db": db, "baseline": label, "workload": workload, **_compare(main, base)})
    return out


def _compare(main: dict[str, Any] | None, base: dict[str, Any] | None) -> dict[str, Any]:
    """One figure of main against the baseline's (either may be missing)."""
    either = main if main is not None else base
    assert either is not None
    found = {
        "unit": either["unit"],
        "main": main and main["median"],
        "main_range": main and (main["min"], main["max"]),
        "baseline_median": base and base["median"],
        "baseline_range": base and (base["min"], base["max"]),
        "missing": "main" if main is None else "baseline" if base is None else None,
        "ratio": None,
        "main_worse": False,
        "apart": False,
        "repeated": False,
    }
    if main is None or base is None:
        return found
    higher = main["better"] == "higher"
    ratio = main["median"] / base["median"] if higher else base["median"] / main["median"]
    # Ranges say something only with repetitions on both sides.
    repeated = min(main["n"], base["n"]) > 1
    apart = repeated and (main["max"] < base["min"] or base["max"] < main["min"])
    return {**found, "ratio": ratio, "main_worse": ratio < 1, "apart": apart, "repeated": repeated}


def _row(rows: list[dict[str, Any]], db: str, workload: str, system: str) -> dict[str, Any] | None:
    found = next((r for r in rows if (r["db"], r["workload"], r["system"]) == (db, workload, system)), None)
    return found if found is not None and found.get("median") else None


def print_comparison(compared: list[dict[str, Any]], fmt: Any) -> None:
    """One table per database and baseline; ``fmt(value, unit)`` formats a figure as the main table."""
    headers = ("figure", "unit", "main", "min-max", "baseline", "min-max", "main vs baseline", "")
    groups = dict.fromkeys((c["db"], c["baseline"]) for c in compared)
    for db, label in groups:
        table = []
        for c in (c for c in compared if (c["db"], c["baseline"]) == (db, label)):
            unit = c["unit"]
            mark = f"missing on {c['missing']}" if c["missing"] else ""
            if c["main_worse"]:
                overlap = "ranges overlap" if c["repeated"] else "one sample"
                mark = "MAIN WORSE" if c["apart"] else f"main worse ({overlap})"
            table.append(
                (
                    c["workload"],
                    unit,
                    fmt(c["main"], unit),
                    "-".join(fmt(v, unit) for v in c["main_range"] or (None,)),
                    fmt(c["baseline_median"], unit),
                    "-".join(fmt(v, unit) for v in c["baseline_range"] or (None,)),
                    "" if c["ratio"] is None else f"{c['ratio']:.2f}x",
                    mark,
                )
            )
        widths = [max(len(h), *(len(row[i]) for row in table)) for i, h in enumerate(headers)]
        print(f"\n{db}: main (the working tree) vs {label}; above 1x main is better")
        for row in (headers, tuple("-" * w for w in widths), *table):
            print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
    worse = [c for c in compared if c["main_worse"]]
    both = [c for c in compared if not c["missing"]]
    if compared:
        print(
            f"\nmain is worse than a baseline on {len(worse)} of {len(both)} plain figures compared"
            + (f", {sum(c['apart'] for c in worse)} of them with ranges apart" if worse else "")
            + (f"; {len(compared) - len(both)} missing on one side" if len(both) < len(compared) else "")
        )
