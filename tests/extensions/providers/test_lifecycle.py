"""The per-direction lifecycle: ordering, duplicates, gaps, and the order of kinds."""

from __future__ import annotations

import pytest

from skulk.extensions.providers.bounds import GAP_EXPIRY_S, MAX_HELD_FRAMES
from skulk.extensions.providers.lifecycle import (
    Inbound,
    LifecycleMisuse,
    Outbound,
    as_json,
    check_chunk,
    emit,
    expired,
    receive,
)
from skulk.shared.types.providers import ProviderFrame


def f(seq: int, kind: str = "chunk", payload: object = None) -> ProviderFrame:
    return ProviderFrame(call_id="c", direction="output", seq=seq, kind=kind, payload=payload)  # type: ignore[arg-type]


def run(frames: list[ProviderFrame], now: float = 0.0) -> tuple[Inbound, list[tuple[int, str]], str | None]:
    view, delivered, violation = Inbound(), [], None
    for frame in frames:
        step = receive(view, frame, now)
        view = step.view
        delivered += [(x.seq, x.kind) for x in step.deliver]
        violation = violation or step.violation
    return view, delivered, violation


@pytest.mark.parametrize(
    ("frames", "delivered", "violation"),
    [
        ([f(0, "started"), f(1), f(2, "completed")], [(0, "started"), (1, "chunk"), (2, "completed")], None),
        # a refusal: a lone terminal at seq 0
        ([f(0, "failed")], [(0, "failed")], None),
        # out of order: held until the gap closes
        (
            [f(0, "started"), f(2), f(1), f(3, "completed")],
            [(0, "started"), (1, "chunk"), (2, "chunk"), (3, "completed")],
            None,
        ),
        # duplicates dropped, before and after the terminal
        (
            [f(0, "started"), f(1), f(1), f(2, "completed"), f(2, "completed"), f(3)],
            [(0, "started"), (1, "chunk"), (2, "completed")],
            None,
        ),
        # a duplicate of a held frame is held once
        ([f(0, "started"), f(2), f(2), f(1)], [(0, "started"), (1, "chunk"), (2, "chunk")], None),
        ([f(0, "chunk")], [], "seq 0 is chunk, expected started"),
        ([f(0, "started"), f(1, "started")], [(0, "started")], "started again at seq 1"),
    ],
)
def test_frames_come_out_in_order_with_one_terminal(frames, delivered, violation):
    _, got, problem = run(frames)
    assert got == delivered
    assert problem == violation


def test_a_gap_holding_too_many_frames_ends_the_direction():
    frames = [f(0, "started")] + [f(seq) for seq in range(2, MAX_HELD_FRAMES + 3)]
    view, _, problem = run(frames)
    assert problem is not None and "frame 1 missing" in problem
    assert view.ended


def test_a_gap_expires_after_its_deadline():
    step = receive(receive(Inbound(), f(0, "started"), 0.0).view, f(2), now=10.0)
    assert expired(step.view, 10.0 + GAP_EXPIRY_S) is None
    assert "frame 1 missing" in (expired(step.view, 10.0 + GAP_EXPIRY_S + 0.1) or "")
    closed = receive(step.view, f(1), 11.0).view
    assert closed.gap_since is None and expired(closed, 100.0) is None


@pytest.mark.parametrize(
    ("kinds", "error"),
    [
        (["started", "chunk", "completed"], None),
        (["chunk"], "chunk at seq 0"),
        (["failed"], None),  # a refusal
        (["started", "started"], "started at seq 1"),
        (["started", "completed", "chunk"], "chunk after the terminal"),
        (["started", "failed", "cancelled"], "cancelled after the terminal"),
    ],
)
def test_the_sender_numbers_frames_and_refuses_what_the_lifecycle_forbids(kinds, error):
    out = Outbound("c", "output")
    try:
        for seq, kind in enumerate(kinds):
            out, frame = emit(out, kind)
            assert frame.seq == seq
    except LifecycleMisuse as exc:
        assert error is not None and error in str(exc)
    else:
        assert error is None


@pytest.mark.parametrize(
    ("value", "schema_problem", "kind"),
    [
        ({"i": 1}, None, None),
        ({"i": object()}, None, "malformed_chunk"),
        ({"i": float("nan")}, None, "malformed_chunk"),
        ("x" * 100, None, "malformed_chunk"),
        ({"i": "x"}, "i: not an integer", "output_invalid"),
    ],
)
def test_a_chunk_goes_out_only_as_json_within_the_cap_and_the_schema(value, schema_problem, kind):
    error = check_chunk(value, 64, lambda _: schema_problem)
    assert (error.kind if error else None) == kind


def test_what_goes_on_the_wire_is_plain_json():
    assert as_json({"a": (1, 2), 3: "x"}) == {"a": [1, 2], "3": "x"}
    _, frame = emit(Outbound("c", "output"), "failed", error_kind="provider_failed", message="x" * 10_000)
    assert frame.message is not None and len(frame.message) == 2048
