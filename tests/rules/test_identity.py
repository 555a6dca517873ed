from __future__ import annotations

import math

import pytest

import django_durable_scheduler as scheduler
from django_durable_scheduler.exceptions import InvalidArgument
from django_durable_scheduler.rules.identity import canonical_json
from django_durable_scheduler.rules.validation import normalize_identifier, to_ms


def test_identity_vector():
    identity = scheduler.derive_occurrence_identity("job-a", 1, 1700000000000, "agenda:daily")
    assert identity.digest == "446d76bcd5745d299bb10199ea7e6822aa628b68173303c1a22b74e1cc0a71d3"
    assert identity.occurrence_id == "occ_" + identity.digest
    assert identity.idempotency_key == "scheduler:v1:" + identity.digest


def test_identity_depends_on_every_part():
    base = scheduler.derive_occurrence_identity("job-a", 1, 1700000000000, "agenda:daily").digest
    assert scheduler.derive_occurrence_identity("job-b", 1, 1700000000000, "agenda:daily").digest != base
    assert scheduler.derive_occurrence_identity("job-a", 2, 1700000000000, "agenda:daily").digest != base
    assert scheduler.derive_occurrence_identity("job-a", 1, 1700000000001, "agenda:daily").digest != base
    assert scheduler.derive_occurrence_identity("job-a", 1, 1700000000000, "agenda:weekly").digest != base


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ({"b": 1, "a": [1, 2.0, "é"]}, '{"a":[1,2,"é"],"b":1}'),
        (-0.0, "0"),
        (1.5, "1.5"),
        (1e21, "1e+21"),
        (1e-7, "1e-7"),
        (0.000001, "0.000001"),
        (12345678901234567890.0, "12345678901234567000"),
        ({"\U0001f600": 1, "\uffff": 2}, '{"\U0001f600":1,"\uffff":2}'),  # UTF-16 code-unit order
        ("line\nbreak\u2028", '"line\\nbreak\u2028"'),
        ([None, True, False], "[null,true,false]"),
        (2**60, "1152921504606847000"),  # beyond 2**53: as JavaScript writes the double
    ],
)
def test_canonical_json(value, expected):
    assert canonical_json(value) == expected


@pytest.mark.parametrize(
    "value",
    [math.nan, math.inf, {1: "x"}, {"a": {1, 2}}, object(), 10**400, (1, 2), "\ud800"],
)
def test_canonical_json_rejects_non_json(value):
    with pytest.raises(InvalidArgument) as info:
        canonical_json(value, "payload")
    assert info.value.details["field"] == "payload"
    assert "payload" in str(info.value)


def test_canonical_json_limits():
    deep: object = 1
    for _ in range(64):
        deep = [deep]
    with pytest.raises(InvalidArgument, match="deeper"):
        canonical_json(deep)
    with pytest.raises(InvalidArgument, match="byte limit"):
        canonical_json("x" * (1024 * 1024))


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("", "empty"),
        ("   ", "empty"),
        ("a\x00b", "control"),
        ("a\x7f", "control"),
        (5, "string"),
        ("x" * 257, "at most"),
    ],
)
def test_identifier_rules(value, message):
    with pytest.raises(InvalidArgument, match=message) as info:
        normalize_identifier(value, "job_id")
    assert info.value.field == "job_id"


def test_identifier_is_stripped():
    assert normalize_identifier("  a b  ", "x") == "a b"


def test_to_ms_refuses_naive_and_bools():
    from datetime import datetime

    with pytest.raises(InvalidArgument, match="naive"):
        to_ms(datetime(2026, 1, 1), "scheduled_for")
    with pytest.raises(InvalidArgument):
        to_ms(True, "scheduled_for")
    with pytest.raises(InvalidArgument):
        to_ms(-1, "scheduled_for")


@pytest.mark.parametrize(
    "job_id, trigger_key",
    [
        ("job", "k"),
        ('quo"te', "back\\slash"),
        ("ünï-cødé", "emoji-😀-key"),
        ("slash/and:colon", "tab-free but spaced key"),
        ("a\u2028b", "</script>"),
    ],
)
def test_identity_material_is_the_canonical_json_of_its_fields(job_id, trigger_key):
    """The identity writes its material out for speed; it must be canonical_json's."""
    import hashlib

    from django_durable_scheduler.rules.identity import (
        IDENTITY_DOMAIN,
        canonical_json,
        derive_occurrence_identity,
    )

    material = canonical_json(
        {
            "contractVersion": 1,
            "jobId": job_id,
            "jobRevision": 7,
            "scheduledFor": 1_767_614_400_123,
            "triggerKey": trigger_key,
        }
    )
    expected = hashlib.sha256((IDENTITY_DOMAIN + material).encode("utf-8")).hexdigest()
    assert derive_occurrence_identity(job_id, 7, 1_767_614_400_123, trigger_key).digest == expected
