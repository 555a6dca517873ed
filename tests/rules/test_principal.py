"""The Principal value: each accepted shape parsed to the same value, bad ones refused with
the field named, and its stored forms (key, label, envelope dict, columns) as they were."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from django_durable_scheduler.exceptions import InvalidArgument
from django_durable_scheduler.rules.authority import Principal, normalize_principal

ALICE = Principal("user", "alice")


@pytest.mark.parametrize(
    "value",
    [
        {"type": "user", "id": "alice"},
        {"type": " user ", "id": "alice\t"},  # stripped, as every identifier
        '["user","alice"]',
        ("user", "alice"),
        ["user", "alice"],
        ALICE,
    ],
)
def test_every_shape_parses_to_the_same_principal(value):
    assert Principal.parse(value) == ALICE


def test_stored_forms():
    odd = Principal('a"b', "c\\d")
    assert ALICE.key == '["user","alice"]'
    assert odd.key == '["a\\"b","c\\\\d"]' and json.loads(odd.key) == ['a"b', "c\\d"]
    assert ALICE.label == "user:alice"
    assert ALICE.as_dict() == {"type": "user", "id": "alice"}
    assert ALICE.details() == {"principal": {"type": "user", "id": "alice"}}
    assert ALICE.columns() == {"principal_type": "user", "principal_id": "alice"}
    # A tuple: equal to, and hashed as, the (type, id) pairs the policy tables are keyed by.
    assert ALICE == ("user", "alice") and {("user", "alice"): 1}[ALICE] == 1
    assert sorted([Principal("b", "a"), Principal("a", "b")]) == [("a", "b"), ("b", "a")]


@pytest.mark.parametrize("principal", [ALICE, Principal('a"b', "c\\d"), Principal("tëam", "ünï")])
def test_round_trips(principal):
    assert Principal.parse(principal.key) == principal
    assert Principal.from_key(principal.key) == principal
    assert Principal.parse(principal.as_dict()) == principal
    assert Principal.of({"principal": principal.as_dict()}) == principal
    assert Principal.of_row(SimpleNamespace(**principal.columns())) == principal
    assert Principal.label_of({"principal": principal.as_dict()}) == principal.label


@pytest.mark.parametrize(
    ("value", "field"),
    [
        ({"type": "user"}, "principal.id"),
        ({"type": "", "id": "alice"}, "principal.type"),
        ({"type": "t" * 65, "id": "alice"}, "principal.type"),
        ({"type": "user", "id": 7}, "principal.id"),
        ({"type": "user", "id": "alice", "role": "x"}, "principal.role"),
        ({"type": "user", "id": '"' * 256}, "principal"),  # over the key column, escaped
        ("user:alice", "principal"),
        ('["user", "alice"]', "principal"),  # not canonical
        ('["user"]', "principal"),
        ('["user",7]', "principal"),
        ('[" user","alice"]', "principal"),  # not the key of the stripped principal
        ('["","alice"]', "principal.type"),
        ("", "principal"),
        (("", "alice"), "principal_type"),
        (("user", None), "principal_id"),
        (("user", "i" * 257), "principal_id"),
        (("user", "alice", "x"), "principal"),
        (None, "principal"),
        (7, "principal"),
    ],
)
def test_bad_shapes_are_refused_naming_the_field(value, field):
    with pytest.raises(InvalidArgument) as info:
        Principal.parse(value)
    assert info.value.details["field"] == field


def test_the_field_prefixes_each_shape():
    with pytest.raises(InvalidArgument) as info:
        Principal.parse({"type": "user", "id": ""}, "authority.principal")
    assert info.value.details["field"] == "authority.principal.id"
    with pytest.raises(InvalidArgument) as info:
        Principal.parse(("", "alice"), "owner")
    assert info.value.details["field"] == "owner_type"


def test_the_envelope_takes_the_dict_shape_only():
    assert normalize_principal({"type": "user", "id": "alice"}) == {"type": "user", "id": "alice"}
    for value in ('["user","alice"]', ("user", "alice")):
        with pytest.raises(InvalidArgument) as info:
            Principal.parse_dict(value, "authority.principal")
        assert info.value.details["field"] == "authority.principal"
        assert "must be an object with type and id" in info.value.message


def test_readers_of_stored_rows_are_lenient():
    assert Principal.from_key('{"type": "user"}') is None
    assert Principal.found_in({"principal": "user:alice"}) is None
    assert Principal.found_in(None) is None
    assert Principal.label_of(None) == ""
    assert Principal.label_of({"principal": {"type": "user"}}) == "user:None"
