from __future__ import annotations

import logging

from django.apps import AppConfig

logger = logging.getLogger("django_durable_scheduler")


class DurableSchedulerConfig(AppConfig):
    name = "django_durable_scheduler"
    label = "durable_scheduler"
    verbose_name = "Durable scheduler"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import checks  # noqa: F401  (registers system checks)
        from .tasks.handlers import register_queue_handlers

        register_queue_handlers()  # runscheduler runs the tasks of every DurableBackend
        discover_handlers()


def discover_handlers() -> None:
    """Import every installed app's handler module, as the admin imports its ``admin``
    modules, so that every process knows the handlers: an enqueue computes the same
    concurrency key and checks the same limits in a web process as in runscheduler's. Off
    with ``DURABLE_SCHEDULER_AUTODISCOVER = False`` (or a bad value, which E003 reports).

    A module that fails to import does not stop Django: the failure is logged here, reported
    by system check E001, and raised by runscheduler and scheduler_sync when they start."""
    from . import conf
    from .checks import handler_module
    from .handlers import registry

    name = handler_module()
    if not conf.settings.AUTODISCOVER or name is None:
        return
    for label, module, exc in registry.import_handler_modules(name):
        logger.warning(
            "handler module %s of app %s fails to import (%s: %s); its handlers are unknown in "
            "this process (durable_scheduler.E001)",
            module,
            label,
            type(exc).__name__,
            exc,
        )
