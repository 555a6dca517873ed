"""``python -m django_durable_scheduler runscheduler ...``: Django's command line (as
``django-admin``), with the stop signals of a runscheduler recorded before Django is
imported (startup.py), so that a stop at any moment of its start-up exits 0."""

from __future__ import annotations

import sys

from .management.startup import install_for_runscheduler


def main() -> None:
    install_for_runscheduler()
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
