"""The master's prune timeout: 30 s in production, lowered only by the test knob."""

import pytest

from skulk.master.main import TEST_DROP_GENERATIONS_ENV, TEST_NODE_TIMEOUT_ENV, dropped_generations, node_timeout_s
from skulk.shared.telemetry_view import NODE_TIMEOUT_S


@pytest.mark.parametrize(
    ("env", "expected"),
    [({}, NODE_TIMEOUT_S), ({TEST_NODE_TIMEOUT_ENV: ""}, NODE_TIMEOUT_S), ({TEST_NODE_TIMEOUT_ENV: "7.5"}, 7.5)],
    ids=["unset", "empty", "set"],
)
def test_node_timeout(env, expected):
    assert node_timeout_s(env) == expected


@pytest.mark.parametrize("raw", ["soon", "0", "-3"])
def test_a_bad_node_timeout_is_refused_with_the_variable_named(raw):
    with pytest.raises(ValueError, match=TEST_NODE_TIMEOUT_ENV):
        node_timeout_s({TEST_NODE_TIMEOUT_ENV: raw})


@pytest.mark.parametrize(("env", "expected"), [({}, 0), ({TEST_DROP_GENERATIONS_ENV: ""}, 0),
                                               ({TEST_DROP_GENERATIONS_ENV: "2"}, 2)])
def test_dropped_generations_is_zero_unless_the_test_knob_is_set(env, expected):
    assert dropped_generations(env) == expected


@pytest.mark.parametrize("raw", ["x", "-1", "1.5"])
def test_a_bad_drop_knob_is_refused_by_name(raw):
    with pytest.raises(ValueError, match=TEST_DROP_GENERATIONS_ENV):
        dropped_generations({TEST_DROP_GENERATIONS_ENV: raw})
