"""``manage.py scheduler_status``: the scheduler's health; exit code 1 when unhealthy."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandParser
from django.db import DatabaseError

from ...housekeeping import ops
from ...kernel.authority import budgets
from ...rules.authority import Principal
from . import DATABASE_HELP, database_alias


class Command(BaseCommand):
    help = (
        "Show occurrence counts, the oldest due lag, workers, kinds nobody handles and policies "
        "near their budget. Exits 1 when unhealthy (for container health checks)."
    )
    # A health probe runs often: skip the system checks (they import every handler module).
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--json", action="store_true", help="print the status as JSON")
        parser.add_argument(
            "--stale-after",
            type=ops.duration_argument,
            default=ops.DEFAULT_STALE_AFTER,
            help="a worker silent this long is not live (default 60 s; 90s, 5m, ...)",
        )
        parser.add_argument(
            "--max-lag",
            type=ops.duration_argument,
            default=ops.DEFAULT_MAX_LAG,
            help="unhealthy when due work has waited longer (default 300 s)",
        )
        parser.add_argument(
            "--check-budgets",
            action="store_true",
            help="also recount the reservations of every current budget window against its usage; "
            "a mismatch is marked (its principal's runs are refused) and makes the status unhealthy",
        )
        parser.add_argument("--database", type=database_alias, default=None, help=DATABASE_HELP)

    def handle(self, *args: Any, **options: Any) -> None:
        checks: list[budgets.WindowCheck] | None = None
        try:
            status = ops.collect_status(
                stale_after=options["stale_after"], max_lag=options["max_lag"], using=options["database"]
            )
            if options["check_budgets"]:
                checks = budgets.audit_budgets(using=options["database"])
        except DatabaseError as exc:
            # A health check that cannot reach its database is unhealthy, not a traceback.
            self.stderr.write(f"scheduler_status: unhealthy: database error: {ops.first_line(exc)}")
            raise SystemExit(1) from None
        problems = list(status.problems)
        mismatched = [check for check in checks or [] if not check.matches]
        problems += [f"budget usage does not match its reservations: {c.describe()}" for c in mismatched]
        if options["json"]:
            found = status.as_json()
            if checks is not None:
                found["budget_checks"] = [_check_json(check) for check in checks]
                found["problems"], found["healthy"] = problems, not problems
            self.stdout.write(json.dumps(found, indent=2))
        else:
            self.stdout.write(ops.format_status(status))
            if checks is not None:
                self.stdout.write(
                    f"Budget windows recounted: {len(checks)}, mismatched: {len(mismatched)}"
                    + "".join(f"\n  {check.describe()}" for check in mismatched)
                )
        if problems:
            self.stderr.write("scheduler_status: unhealthy: " + "; ".join(problems))
            raise SystemExit(1)


def _check_json(check: budgets.WindowCheck) -> dict[str, Any]:
    return {
        "principal": Principal.of_row(check).as_dict(),
        "policy_revision": check.policy_revision,
        "window_started_at": check.window_started_at.isoformat(),
        "usage": {"runs": check.usage[0], "units": check.usage[1]},
        "reservations": {"runs": check.reservations[0], "units": check.reservations[1]},
        "matches": check.matches,
    }
