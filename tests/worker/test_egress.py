"""The worker's send queue keeps room for terminals: a payload flood never costs a stream its end."""

import pytest

from skulk.shared.types.chunks import StreamPayload, StreamStarted, StreamTerminal, TokenChunk
from skulk.worker.egress import EGRESS_BOUND, EGRESS_CAPACITY, TERMINAL_RESERVE, egress_admits

STARTED = StreamStarted(command_id="c", runner_id="r")
PAYLOAD = StreamPayload(command_id="c", seq=1, chunk=TokenChunk(command_id="c", text="x"))
TERMINAL = StreamTerminal(command_id="c", seq=2, outcome="completed")


@pytest.mark.parametrize(
    ("frame", "depth", "admitted"),
    [
        (PAYLOAD, 0, True),
        (PAYLOAD, EGRESS_CAPACITY - 1, True),
        (PAYLOAD, EGRESS_CAPACITY, False),  # payloads stop at the capacity...
        (STARTED, EGRESS_CAPACITY, False),
        (TERMINAL, EGRESS_CAPACITY, True),  # ...terminals may use the reserve
        (TERMINAL, EGRESS_BOUND - 1, True),
        (TERMINAL, EGRESS_BOUND, False),  # the hard bound holds for everyone
    ],
)
def test_egress_admits(frame, depth, admitted):
    assert egress_admits(frame, depth) is admitted


def test_the_reserve_covers_every_stream_an_api_node_admits():
    from skulk.api.streams import MAX_OPEN_STREAMS

    assert TERMINAL_RESERVE >= MAX_OPEN_STREAMS and EGRESS_BOUND == EGRESS_CAPACITY + TERMINAL_RESERVE
