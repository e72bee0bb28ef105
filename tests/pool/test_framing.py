"""Where ggml RPC messages end (`skulk.pool.framing`): a byte stream cut anywhere reads the
same, and only data-only commands make the relay wait for more."""

from __future__ import annotations

import pytest

from skulk.pool.framing import BETWEEN, REQUESTS, RESPONSES, Cursor, Framing, advance, lingers

SET_TENSOR, GET_TENSOR, GRAPH_COMPUTE, GRAPH_RECOMPUTE, FREE_BUFFER, HELLO = 6, 8, 10, 16, 4, 14


def request(command: int, payload: bytes) -> bytes:
    return bytes([command]) + len(payload).to_bytes(8, "little") + payload


def response(payload: bytes) -> bytes:
    return len(payload).to_bytes(8, "little") + payload


STREAMS = [
    (REQUESTS, request(SET_TENSOR, b"a" * 300)),
    (REQUESTS, request(SET_TENSOR, b"a" * 300) + request(GRAPH_RECOMPUTE, b"g" * 40) + request(GET_TENSOR, b"r" * 24)),
    (REQUESTS, request(HELLO, b"")),
    (RESPONSES, response(b"x" * 2048)),
    (RESPONSES, response(b"") + response(b"y" * 9)),
]


@pytest.mark.parametrize(("framing", "stream"), STREAMS)
def test_a_stream_cut_anywhere_ends_between_messages(framing: Framing, stream: bytes) -> None:
    whole = advance(framing, BETWEEN, stream)
    assert whole.between_messages
    for cut in range(len(stream) + 1):
        first = advance(framing, BETWEEN, stream[:cut])
        assert advance(framing, first, memoryview(stream)[cut:]) == whole


@pytest.mark.parametrize(("framing", "data", "expected"), [
    (REQUESTS, b"", BETWEEN),
    (REQUESTS, bytes([SET_TENSOR]), Cursor(header=bytes([SET_TENSOR]))),
    (REQUESTS, request(SET_TENSOR, b"abc")[:9], Cursor(payload_left=3, command=SET_TENSOR)),
    (REQUESTS, request(SET_TENSOR, b"abc")[:10], Cursor(payload_left=2, command=SET_TENSOR)),
    (REQUESTS, request(SET_TENSOR, b"abc"), Cursor(command=SET_TENSOR)),
    (REQUESTS, request(SET_TENSOR, b"abc") + bytes([GET_TENSOR, 1]), Cursor(header=bytes([GET_TENSOR, 1]),
                                                                            command=SET_TENSOR)),
    (RESPONSES, response(b"abcd")[:8], Cursor(payload_left=4)),
    (RESPONSES, response(b"abcd"), BETWEEN),
])
def test_cursor_after(framing: Framing, data: bytes, expected: Cursor) -> None:
    assert advance(framing, BETWEEN, data) == expected


@pytest.mark.parametrize(("stream", "waits"), [
    (request(SET_TENSOR, b"a"), True),  # data only: the graph that uses it is coming
    (request(FREE_BUFFER, b"a"), True),
    (request(GRAPH_COMPUTE, b"g"), False),  # computes now: never held back
    (request(GRAPH_RECOMPUTE, b"g"), False),
    (request(GET_TENSOR, b"r"), False),  # answered: the driver waits for it
    (request(SET_TENSOR, b"abc")[:-1], False),  # inside a message: the rest is waited for anyway
    (b"", False),
])
def test_lingers_only_after_a_data_only_command(stream: bytes, waits: bool) -> None:
    assert lingers(advance(REQUESTS, BETWEEN, stream)) is waits


def test_answers_never_linger() -> None:
    assert not lingers(advance(RESPONSES, BETWEEN, response(b"logits")))
