"""The JSON type guards answer exactly as the isinstance checks they stand for."""

from __future__ import annotations

import pytest

from skulk.shared.json_shapes import is_json_array, is_json_object


@pytest.mark.parametrize(
    ("value", "is_object", "is_array"),
    [
        ({}, True, False),
        ({"type": "object"}, True, False),
        ([], False, True),
        ([1, "a"], False, True),
        ((1, 2), False, False),  # a tuple is no JSON array: schemas come from json.loads
        ("object", False, False),
        (None, False, False),
        (True, False, False),
        (3, False, False),
    ],
)
def test_guards_match_isinstance(value: object, is_object: bool, is_array: bool) -> None:
    assert is_json_object(value) is is_object
    assert is_json_array(value) is is_array
