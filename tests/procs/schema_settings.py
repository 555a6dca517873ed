"""Settings of tests/test_schema_change.py's subprocesses: tests/settings.py with the scheduler
as the only app, so that ``migrate`` builds only its tables in the scratch database."""

from tests.settings import *  # noqa: F403

INSTALLED_APPS = ["django_durable_scheduler"]
ROOT_URLCONF = __name__  # tests/urls.py needs the admin
urlpatterns: list = []
