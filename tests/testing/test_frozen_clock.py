"""``testing.clock()``: the scheduler's clock setting frozen for a block, moved forward by
``advance()``, put anywhere by ``set()``, and given back at the end."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

from django.conf import settings

from django_durable_scheduler import conf, testing

from .conftest import START


def test_the_scheduler_time_is_frozen_moved_and_given_back():
    before = getattr(settings, "DURABLE_SCHEDULER_CLOCK", None)
    with testing.clock(START) as clock:
        assert conf.now() == clock.now == clock() == START
        assert clock.advance(hours=1, minutes=30) == START + timedelta(hours=1, minutes=30)
        assert (
            clock.advance(timedelta(days=1)) == conf.now() == START + timedelta(days=1, hours=1, minutes=30)
        )
        assert clock.advance(0.5) == conf.now()
        assert clock.set(START) == conf.now() == START
        # Any zone in, UTC out: what the scheduler stores.
        berlin = timezone(timedelta(hours=1))
        assert clock.set(datetime(2026, 3, 23, 13, 0, tzinfo=berlin)) == START
        assert clock.now.tzinfo is UTC
        assert repr(clock) == "<testing.Clock at 2026-03-23T12:00:00+00:00>"
    assert getattr(settings, "DURABLE_SCHEDULER_CLOCK", None) is before


def test_without_a_time_it_freezes_the_real_time_now():
    before = datetime.now(UTC).replace(microsecond=0)
    with testing.clock() as clock:
        after = datetime.now(UTC)
        assert before <= clock.now <= after
        assert clock.now.microsecond % 1000 == 0  # the scheduler keeps milliseconds
        assert conf.now() == clock.now


def test_the_fixture_freezes_it_for_the_test(scheduler_clock):
    assert conf.now() == scheduler_clock.now
    scheduler_clock.advance(weeks=1)
    assert conf.now() == scheduler_clock.now


def test_it_holds_where_the_database_tells_the_time(settings):
    settings.DURABLE_SCHEDULER_TIME_SOURCE = "database"
    with testing.clock(START):
        assert conf.now() == START
    assert settings.DURABLE_SCHEDULER_TIME_SOURCE == "database"
