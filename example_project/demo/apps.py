from django.apps import AppConfig


class DemoConfig(AppConfig):
    name = "demo"
    verbose_name = "Scheduler demo"

    def ready(self) -> None:
        # Import the handlers so that they are registered before the scheduler starts.
        from . import tasks  # noqa: F401
