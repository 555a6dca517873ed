"""``SchedulerTestMixin`` in unittest-style suites: Django's ``TestCase``, whose transaction
never commits (the drain runs inside it), and ``TransactionTestCase``, which commits."""

from __future__ import annotations

from datetime import UTC, datetime

from django.test import TestCase, TransactionTestCase

import django_durable_scheduler as scheduler
from django_durable_scheduler import testing
from django_durable_scheduler.handlers import registry
from django_durable_scheduler.models import Occurrence


def send(ctx):
    if ctx.payload.get("fail") and ctx.attempt == 1:
        raise RuntimeError("smtp down")
    return {"sent_to": ctx.payload["to"]}


class Scenario(testing.SchedulerTestMixin):
    """The same tests in both kinds of TestCase."""

    def setUp(self):
        registry.handler("cases.send")(send)
        self.addCleanup(registry.unregister, "cases.send")
        self.clock = self.freeze_clock(datetime(2026, 3, 23, 12, 0, tzinfo=UTC))
        scheduler.create_job("mail", "cases.send", retry_base_delay=60)

    def test_enqueue_assert_drain_and_retry(self):
        scheduler.enqueue("mail", scheduled_for=self.clock.now, trigger_key="a", payload={"to": "ada"})
        scheduler.enqueue(
            "mail", scheduled_for=self.clock.now, trigger_key="b", payload={"to": "bob", "fail": True}
        )
        (ada,) = self.assertEnqueued(job="mail", payload_contains={"to": "ada"}, count=1)
        self.assertEqual(len(self.enqueued(kind="cases.send")), 2)
        ran = {run.occurrence_id: run for run in self.drain()}
        self.assertEqual(ran[ada.pk].result, {"sent_to": "ada"})
        self.assertNotEnqueued(payload_contains={"to": "ada"})
        self.assertEnqueued(payload_contains={"to": "bob"}, status="retry_wait")
        self.clock.advance(minutes=2)
        (retried,) = self.drain()
        self.assertEqual((retried.attempt, retried.status), (2, "succeeded"))
        self.assertEqual(Occurrence.objects.filter(status="succeeded").count(), 2)

    def test_run_handler_and_grant(self):
        self.assertEqual(self.run_handler("cases.send", {"to": "eve"}).result, {"sent_to": "eve"})
        policy = self.grant("team:mail", "cases.send", runs=1)
        self.assertEqual(policy.max_runs, 1)

    def test_a_failing_assertion_lists_the_queue(self):
        scheduler.enqueue("mail", scheduled_for=self.clock.now, trigger_key="a", payload={"to": "ada"})
        with self.assertRaises(AssertionError) as failed:
            self.assertEnqueued(job="mail", payload={"to": "zed"})
        self.assertIn("mail (cases.send) queued", str(failed.exception))


class InATestCase(Scenario, TestCase):
    pass


class InATransactionTestCase(Scenario, TransactionTestCase):
    pass


class DeclaredJobs(testing.SchedulerTestMixin, TestCase):
    def test_the_declared_jobs_are_made_as_runscheduler_makes_them(self):
        scheduler.declare_job("cases-declared", "cases.declared", trigger={"every": 60})
        from django_durable_scheduler.handlers import declared

        self.addCleanup(declared.undeclare, "cases-declared")
        result = self.sync_declared_jobs()
        self.assertIn("cases-declared", result["created"])
        self.assertEqual(scheduler.get_job("cases-declared").trigger["every"], 60)
