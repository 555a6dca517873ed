from __future__ import annotations

from django.apps import AppConfig


class DurableSchedulerConfig(AppConfig):
    name = "django_durable_scheduler"
    label = "durable_scheduler"
    verbose_name = "Durable scheduler"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import checks  # noqa: F401  (registers system checks)
        from .tasks.handlers import register_queue_handlers

        register_queue_handlers()  # runscheduler runs the tasks of every DurableBackend
