"""Topic table invariants and plane semantics."""

from __future__ import annotations

import pytest
from pydantic import TypeAdapter

from skulk.routing.constants import NETWORK_VERSION, check_id, topic_key
from skulk.routing.topics import TOPICS, Plane, Topic, TopicTableError, validate_topic_table
from skulk.shared.types.base import WireModel


class A(WireModel):
    x: int


class B(WireModel):
    y: str


def test_the_cluster_table_is_valid() -> None:
    validate_topic_table(TOPICS)


def test_model_class_and_type_adapter_are_both_accepted() -> None:
    by_class = Topic("a", Plane.CONTROL, A)
    by_union = Topic("ab", Plane.CONTROL, TypeAdapter(A | B))
    assert by_class.type_adapter.validate_python({"x": 1}) == A(x=1)
    assert by_union.type_adapter.validate_python({"y": "v"}) == B(y="v")
    validate_topic_table([by_class, by_union])


@pytest.mark.parametrize(
    ("topics", "problem"),
    [
        ([Topic("a", Plane.CONTROL, A), Topic("a", Plane.TELEMETRY, A)], "used twice"),
        ([Topic("a", "control", A)], "has no plane"),  # type: ignore[arg-type]
        ([Topic("a/b", Plane.CONTROL, A)], "single key-expression chunk"),
        ([Topic("a*", Plane.CONTROL, A)], "single key-expression chunk"),
        ([Topic("presence", Plane.CONTROL, A)], "reserved"),
        ([Topic("d", Plane.DATA, A)], "must be node-addressed"),
        (["not a topic"], "is not a Topic"),
    ],
)
def test_invalid_tables_are_refused_with_the_reason(topics, problem) -> None:
    with pytest.raises(TopicTableError) as info:
        validate_topic_table(topics)
    assert any(problem in text for text in info.value.problems), info.value.problems


def test_plane_semantics() -> None:
    assert Plane.CONTROL.reliable and Plane.CONTROL.blocks_on_congestion and not Plane.CONTROL.latest_value
    assert not Plane.TELEMETRY.reliable and not Plane.TELEMETRY.blocks_on_congestion and Plane.TELEMETRY.latest_value
    assert Plane.DATA.reliable and Plane.DATA.blocks_on_congestion and not Plane.DATA.latest_value


def test_key_expressions_carry_the_network_version() -> None:
    assert topic_key("commands") == f"skulk/{NETWORK_VERSION}/commands"
    assert topic_key("data", "node-1") == f"skulk/{NETWORK_VERSION}/data/node-1"


@pytest.mark.parametrize("bad", ["", "a/b", "a*", "$x", "a b", "-x", ".x", "@x", "x" * 129])
def test_ids_that_would_break_key_expressions_are_refused(bad) -> None:
    with pytest.raises(ValueError):
        check_id("node id", bad)
