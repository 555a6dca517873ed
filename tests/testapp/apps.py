from django.apps import AppConfig
from django.conf import settings
from django.db.backends.signals import connection_created


class TestAppConfig(AppConfig):
    name = "tests.testapp"
    label = "testapp"

    def ready(self) -> None:
        # Every occurrence write checked at run time, on each connection as it opens.
        if getattr(settings, "CHECK_OCCURRENCE_WRITES", False):
            from ..writecheck import install

            connection_created.connect(install, dispatch_uid="tests.writecheck")
