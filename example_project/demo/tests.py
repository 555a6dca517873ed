"""The demo's tests, unittest style (``python manage.py test demo``), with the scheduler's
testing toolkit (docs/testing.md shows them): each runs inside Django's ``TestCase``, whose
transaction never commits, and ``drain()`` runs the work in it."""

from __future__ import annotations

from datetime import UTC, datetime

from django.test import SimpleTestCase, TestCase

import django_durable_scheduler as scheduler
from django_durable_scheduler import testing

from .tasks import greet


class GreetViewTests(testing.SchedulerTestMixin, TestCase):
    def test_the_view_enqueues_a_task_that_greets(self):
        response = self.client.get("/greet/", {"name": "Ada"})
        self.assertEqual(response.status_code, 202)
        self.assertEnqueued(kind="django.tasks:default", payload_contains={"args": ["Ada"]}, count=1)

        (run,) = self.drain()
        self.assertEqual(run.result, {"greeted": "Ada"})
        result = greet.get_result(response.json()["id"])
        self.assertEqual((result.status, result.return_value), ("SUCCESSFUL", {"greeted": "Ada"}))


class FlakyHandlerTests(testing.SchedulerTestMixin, SimpleTestCase):
    def test_the_first_attempt_fails_and_the_second_recovers(self):
        with self.assertRaisesMessage(RuntimeError, "the first attempt always fails"):
            self.run_handler("demo.flaky")
        call = self.run_handler("demo.flaky", attempt=2)
        self.assertEqual(call.result, {"recovered_on_attempt": 2})


class MorningReportTests(testing.SchedulerTestMixin, TestCase):
    def test_it_runs_at_nine_in_berlin_across_the_change_to_summer_time(self):
        clock = self.freeze_clock(datetime(2026, 3, 28, 7, 0, tzinfo=UTC))  # 08:00 in Berlin
        self.sync_declared_jobs()  # what runscheduler does when it starts

        clock.advance(hours=1)  # Saturday 09:00 CET is 08:00 UTC
        (saturday,) = self.drain(kinds=["demo.morning-report"])
        self.assertEqual(saturday.scheduled_for, datetime(2026, 3, 28, 8, 0, tzinfo=UTC))

        clock.advance(hours=22, minutes=59)  # Sunday 08:59 CEST: not yet
        self.assertEqual(self.drain(kinds=["demo.morning-report"]), [])
        clock.advance(minutes=1)  # Sunday 09:00 CEST is 07:00 UTC
        (sunday,) = self.drain(kinds=["demo.morning-report"])
        self.assertEqual(sunday.scheduled_for, datetime(2026, 3, 29, 7, 0, tzinfo=UTC))


class RetryTests(testing.SchedulerTestMixin, TestCase):
    def test_the_retry_runs_once_its_backoff_has_passed(self):
        clock = self.freeze_clock()
        scheduler.create_job("flaky", "demo.flaky", retry_base_delay=60)  # 60 s, +-20 % jitter
        scheduler.enqueue("flaky", scheduled_for=clock.now, trigger_key="once")

        (first,) = self.drain()
        self.assertEqual(first.status, "retry_wait")
        self.assertIn("the first attempt always fails", first.error["message"])
        clock.advance(seconds=45)
        self.assertEqual(self.drain(), [])  # still backing off
        clock.advance(seconds=30)
        (second,) = self.drain()
        self.assertEqual((second.attempt, second.status), (2, "succeeded"))


class ChainAndBatchTests(testing.SchedulerTestMixin, TestCase):
    def setUp(self):
        self.clock = self.freeze_clock()
        scheduler.create_job("summary", "demo.summary")
        scheduler.create_job("hello", "demo.hello", then=["summary"])
        scheduler.create_job("greetings", "demo.hello")

    def test_the_next_step_of_a_chain_sees_what_the_first_returned(self):
        scheduler.enqueue("hello", scheduled_for=self.clock.now, trigger_key="ada", payload={"name": "Ada"})
        hello, summary = self.drain()
        self.assertEqual((hello.job_id, summary.job_id), ("hello", "summary"))
        self.assertEqual(summary.result, {"after": {"greeted": "Ada"}})

    def test_a_batch_callback_runs_once_every_member_has_ended(self):
        names = ["Ada", "Grace", "Edsger"]
        items = [{"scheduled_for": self.clock.now, "trigger_key": n, "payload": {"name": n}} for n in names]
        scheduler.enqueue_batch("greetings", items, callback="summary")
        *greetings, callback = self.drain()
        self.assertEqual(len(greetings), 3)
        self.assertEqual(callback.result, {"batch": {"succeeded": 3, "dead_letter": 0, "cancelled": 0}})


class BudgetTests(testing.SchedulerTestMixin, TestCase):
    DEMO = {"principal": {"type": "service", "id": "demo"}, "requestedCapabilities": ["demo.run"]}

    def setUp(self):
        self.clock = self.freeze_clock()
        scheduler.create_job("hello", "demo.hello", authority=self.DEMO)

    def test_a_run_the_policy_does_not_allow_is_denied(self):
        self.grant("service:demo", "demo.other")  # not demo.run
        scheduler.enqueue("hello", scheduled_for=self.clock.now, trigger_key="1")
        (run,) = self.drain()
        self.assertTrue(run.denied)
        self.assertEqual(run.status, "dead_letter")

    def test_a_run_over_the_budget_waits_for_the_next_window(self):
        self.grant("service:demo", "demo.run", runs=1, window=3600)
        for key in ("1", "2"):
            scheduler.enqueue("hello", scheduled_for=self.clock.now, trigger_key=key)
        first, second = self.drain()
        self.assertEqual((first.status, second.deferred), ("succeeded", True))
        self.clock.advance(hours=1)
        (later,) = self.drain()
        self.assertEqual(later.occurrence_id, second.occurrence_id)
