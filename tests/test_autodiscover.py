"""Handlers known in every process (docs/reference.md, "Handlers known in every process"):
the handler modules are imported when Django starts, so an enqueue from a process that never
ran runscheduler keys a handler's occurrences as runscheduler's process does; with
``DURABLE_SCHEDULER_AUTODISCOVER = False`` they are not imported."""

from __future__ import annotations

import json
import sys

import pytest

import django_durable_scheduler as scheduler
from django_durable_scheduler.apps import discover_handlers
from django_durable_scheduler.handlers import registry
from django_durable_scheduler.models import Occurrence

from .conftest import AUTHORITY, run_python

KIND = "test.keyed-by-function"

# A fresh process, as a web process is: django.setup() and an enqueue, nothing else.
ENQUEUE = """
import json, sys
import django
django.setup()
import django_durable_scheduler as scheduler
from django_durable_scheduler.handlers import registry
occurrence, _ = scheduler.enqueue(
    "fn-keyed", scheduled_for=1_700_000_000_000, trigger_key="web", payload={"tenant": "t1"}
)
print(json.dumps({
    "key": occurrence.concurrency_key,
    "imported": "tests.testapp.tasks" in sys.modules,
    "handler": registry.get_handler("test.keyed-by-function") is not None,
}))
"""


def enqueue_elsewhere(**env: str) -> dict:
    proc = run_python(ENQUEUE, **env)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


@pytest.mark.django_db(transaction=True)
def test_an_enqueue_in_a_fresh_process_keys_as_the_worker_does():
    scheduler.create_job("fn-keyed", KIND, authority=AUTHORITY)
    seen = enqueue_elsewhere()
    assert seen == {"key": "tenant-t1", "imported": True, "handler": True}
    # What runscheduler's process (this one: it imported the handler modules) computes.
    here, _ = scheduler.enqueue(
        "fn-keyed", scheduled_for=1_700_000_000_000, trigger_key="worker", payload={"tenant": "t1"}
    )
    assert here.concurrency_key == seen["key"]
    assert Occurrence.objects.get(trigger_key="web").concurrency_key == "tenant-t1"


@pytest.mark.django_db(transaction=True)
def test_with_autodiscovery_off_the_handler_modules_are_not_imported():
    scheduler.create_job("fn-keyed", KIND, authority=AUTHORITY)
    seen = enqueue_elsewhere(DSCH_AUTODISCOVER="0")
    # Unknown there: stored without a key (a worker keys it at claim).
    assert seen == {"key": None, "imported": False, "handler": False}


def test_discovery_imports_each_module_once(settings, monkeypatch):
    calls: list[str] = []
    real = registry.import_module

    def counting(name: str):
        calls.append(name)
        return real(name)

    monkeypatch.setattr(registry, "import_module", counting)
    discover_handlers()
    registry.autodiscover()
    assert "tests.testapp.tasks" in sys.modules
    assert calls.count("tests.testapp.tasks") == 2  # both found it imported: one import in all
    settings.DURABLE_SCHEDULER_AUTODISCOVER = False
    calls.clear()
    discover_handlers()
    assert calls == []


def test_a_broken_handler_module_reports_its_own_error_every_time(tmp_path, monkeypatch):
    package = tmp_path / "dsch_half_app"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "tasks.py").write_text(
        "import django_durable_scheduler as scheduler\n"
        "@scheduler.handler('test.half-registered')\n"
        "def first(ctx):\n    return None\n"
        "raise RuntimeError('boom after a handler')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    from django.conf import settings as django_settings
    from django.test.utils import override_settings

    from django_durable_scheduler import checks

    try:
        # Installing the app runs ready() again: the import fails there, and is logged.
        with override_settings(INSTALLED_APPS=[*django_settings.INSTALLED_APPS, "dsch_half_app"]):
            (message,) = checks.check_handler_modules()
            assert message.id == "durable_scheduler.E001"
            assert "RuntimeError: boom after a handler" in message.msg
            with pytest.raises(RuntimeError, match="boom after a handler"):
                registry.autodiscover()
    finally:
        registry.unregister("test.half-registered")
        for name in [m for m in sys.modules if m.startswith("dsch_half_app")]:
            del sys.modules[name]
