"""Create the example's superuser ``admin``, or give it a new password, so the admin can be opened."""

from __future__ import annotations

import secrets
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandParser

USERNAME = "admin"


class Command(BaseCommand):
    help = "Create the superuser 'admin' if missing and set its password (a new random one by default)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--password", help="the password to set (default: a new random one)")

    def handle(self, *args: Any, **options: Any) -> None:
        password = options["password"] or secrets.token_urlsafe(9)
        user, created = get_user_model().objects.get_or_create(
            username=USERNAME, defaults={"is_staff": True, "is_superuser": True}
        )
        # A demo database only: a fresh password each run beats one nobody remembers.
        user.set_password(password)
        user.is_staff = user.is_superuser = True
        user.save()
        done = "created" if created else "updated"
        self.stdout.write(f"{done} superuser {USERNAME!r}, password {password}")
