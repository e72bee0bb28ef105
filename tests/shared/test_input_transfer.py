"""The pure core of task-input transfer (`skulk.shared.input_transfer`): splitting, reassembly
in any order, duplicates, contradictions, the byte bounds, expiry, the digest check, and the
sender's verdicts. No event loop, no processes."""

from __future__ import annotations

import base64
import hashlib
import random

import pytest

from skulk.shared.input_transfer import (
    ACK_DEADLINE_S,
    CHUNK_BYTES,
    MAX_COMMAND_INPUT_BYTES,
    MAX_IN_FLIGHT_BYTES,
    MAX_SEND_TRIES,
    MAX_SENDER_IN_FLIGHT_BYTES,
    TEST_DROP_INPUT_CHUNKS_ENV,
    TRANSFER_DEADLINE_S,
    Completed,
    Duplicate,
    GiveUp,
    Outgoing,
    Pending,
    Reassemblies,
    Refused,
    Resend,
    ack_for,
    dropped_input_chunks,
    encode_input,
    sender_verdict,
    split,
)
from skulk.shared.types.ids import CommandId, ModelId
from skulk.shared.types.task_inputs import TaskInput, TaskInputChunk, TransferError
from skulk.shared.types.workload_io import MAX_AUDIO_UPLOAD_BYTES, EchoParams, TranscriptionParams

SMALL_CHUNK = 1000
"""Chunk size the tables use so a few KB of text is several chunks."""


def echo(text: str, command_id: str = "c1") -> TaskInput:
    return TaskInput(command_id=CommandId(command_id), params=EchoParams(model_id=ModelId("m"), text=text))


BIG = echo(random.Random(31).randbytes(2400).hex())  # 4800 chars: 5 chunks of SMALL_CHUNK


def chunks_of(item: TaskInput = BIG, transfer_id: str = "t1") -> tuple[TaskInputChunk, ...]:
    chunks = split(item, transfer_id, SMALL_CHUNK)
    assert not isinstance(chunks, TransferError)
    return chunks


def feed(chunks, book: Reassemblies | None = None, sender: str = "a", now: float = 0.0):
    book = book or Reassemblies()
    outcomes = []
    for chunk in chunks:
        book, outcome = book.receive(sender, chunk, now)
        outcomes.append(outcome)
    return book, outcomes


def test_split_headers_and_sizes():
    chunks = chunks_of()
    data = encode_input(BIG)
    assert len(chunks) == -(-len(data) // SMALL_CHUNK) > 1
    assert {(c.count, c.total_bytes, c.sha256, c.transfer_id) for c in chunks} == {
        (len(chunks), len(data), hashlib.sha256(data).hexdigest(), "t1")}
    assert [c.seq for c in chunks] == list(range(len(chunks)))
    assert b"".join(base64.b64decode(c.data_b64) for c in chunks) == data


def test_a_text_only_input_is_one_chunk_of_the_default_size():
    chunks = split(echo("hello"), "t1")
    assert not isinstance(chunks, TransferError) and len(chunks) == 1


def test_the_largest_accepted_upload_fits_one_transfer_and_a_bigger_input_is_refused():
    audio = base64.b64encode(bytes(MAX_AUDIO_UPLOAD_BYTES)).decode()
    upload = TaskInput(command_id=CommandId("c1"), params=TranscriptionParams(model_id=ModelId("m"), audio_b64=audio, audio_sha256="0" * 64))
    chunks = split(upload, "t1")
    assert not isinstance(chunks, TransferError)
    assert len(chunks) == -(-len(encode_input(upload)) // CHUNK_BYTES)
    over = TranscriptionParams.model_construct(model_id="m", audio_b64="A" * MAX_COMMAND_INPUT_BYTES,
                                               audio_sha256="0" * 64, workload="transcription")
    assert split(TaskInput.model_construct(command_id="c1", params=over), "t1") == TransferError.TOO_LARGE


ORDERS = {
    "in order": lambda n: list(range(n)),
    "reversed": lambda n: list(reversed(range(n))),
    "shuffled": lambda n: random.Random(7).sample(range(n), n),
    "with duplicates": lambda n: [0, 0, *range(n - 1), 1, n - 1],
}


@pytest.mark.parametrize("order", ORDERS.values(), ids=list(ORDERS))
def test_reassembly_in_any_order(order):
    chunks = chunks_of()
    book, outcomes = feed([chunks[i] for i in order(len(chunks))])
    assert isinstance(outcomes[-1], Completed)
    assert outcomes[-1].item == BIG and outcomes[-1].ack.ok
    assert all(isinstance(o, Pending | Duplicate) for o in outcomes[:-1])
    assert book.partials == {} and book.in_flight_bytes() == 0


def test_a_resent_finished_transfer_is_acked_again_on_its_last_chunk():
    chunks = chunks_of()
    book, _ = feed(chunks)
    book, outcomes = feed(chunks, book)
    assert [o.ack is not None for o in outcomes if isinstance(o, Duplicate)] == [False] * (len(chunks) - 1) + [True]
    assert outcomes[-1].ack.ok


def _tamper(chunk: TaskInputChunk, **changes) -> TaskInputChunk:
    return chunk.model_copy(update=changes)


GOOD = chunks_of()
REFUSALS = {
    "another count": (GOOD[1].model_copy(update={"count": 9}), TransferError.CHUNK_MISMATCH),
    "another size": (_tamper(GOOD[1], total_bytes=GOOD[1].total_bytes + 1), TransferError.CHUNK_MISMATCH),
    "another digest": (_tamper(GOOD[1], sha256="f" * 64), TransferError.CHUNK_MISMATCH),
    "seq past count": (_tamper(GOOD[1], seq=len(GOOD)), TransferError.CHUNK_MISMATCH),
    "not base64": (_tamper(GOOD[1], data_b64="!!"), TransferError.CHUNK_MISMATCH),
    "oversize piece": (_tamper(GOOD[1], data_b64=base64.b64encode(bytes(GOOD[0].total_bytes)).decode()),
                       TransferError.CHUNK_MISMATCH),
}


@pytest.mark.parametrize(("bad", "error"), REFUSALS.values(), ids=list(REFUSALS))
def test_a_chunk_contradicting_its_header_refuses_the_transfer(bad, error):
    book, _ = feed([GOOD[0]])
    book, outcome = book.receive("a", bad, 0.0)
    assert isinstance(outcome, Refused) and outcome.ack.error == error and not outcome.ack.ok
    assert book.partials == {}


def test_a_chunk_from_another_sender_refuses_the_transfer():
    book, _ = feed([GOOD[0]])
    _, outcome = book.receive("b", GOOD[1], 0.0)
    assert isinstance(outcome, Refused) and outcome.ack.error == TransferError.CHUNK_MISMATCH


def test_corrupted_bytes_fail_the_digest_check():
    flipped = bytearray(base64.b64decode(GOOD[2].data_b64))
    flipped[0] ^= 1
    corrupt = [*GOOD[:2], _tamper(GOOD[2], data_b64=base64.b64encode(bytes(flipped)).decode()), *GOOD[3:]]
    _, outcomes = feed(corrupt)
    assert isinstance(outcomes[-1], Refused) and outcomes[-1].ack.error == TransferError.DIGEST_MISMATCH


def test_bytes_that_hash_right_but_are_no_task_input_are_undecodable():
    data = b'{"not": "an input"}'
    chunk = TaskInputChunk(command_id=CommandId("c1"), transfer_id="t1", seq=0, count=1, total_bytes=len(data),
                           sha256=hashlib.sha256(data).hexdigest(), data_b64=base64.b64encode(data).decode())
    _, outcome = Reassemblies().receive("a", chunk, 0.0)
    assert isinstance(outcome, Refused) and outcome.ack.error == TransferError.UNDECODABLE


def header(total_bytes: int, transfer_id: str = "new", count: int = 1) -> TaskInputChunk:
    return TaskInputChunk(command_id=CommandId("c9"), transfer_id=transfer_id, seq=0, count=count + 1, total_bytes=total_bytes,
                          sha256="0" * 64, data_b64="")


BOUNDS = {
    "over a command's bound": ([], "a", MAX_COMMAND_INPUT_BYTES + 1, TransferError.TOO_LARGE),
    "at a command's bound": ([], "a", MAX_COMMAND_INPUT_BYTES, None),
    "sender's budget full": ([("a", MAX_COMMAND_INPUT_BYTES)] * 3, "a", MAX_SENDER_IN_FLIGHT_BYTES - 3 * MAX_COMMAND_INPUT_BYTES + 1,
                             TransferError.RECEIVER_BUSY),
    "another sender still fits": ([("a", MAX_COMMAND_INPUT_BYTES)] * 3, "b", MAX_COMMAND_INPUT_BYTES, None),
    "total full": ([(f"s{i}", MAX_COMMAND_INPUT_BYTES) for i in range(MAX_IN_FLIGHT_BYTES // MAX_COMMAND_INPUT_BYTES)],
                   "z", MAX_IN_FLIGHT_BYTES % MAX_COMMAND_INPUT_BYTES + 1, TransferError.RECEIVER_BUSY),
    "too many chunks for the size": ([], "a", 0, TransferError.CHUNK_MISMATCH),
}


@pytest.mark.parametrize(("in_flight", "sender", "size", "error"), BOUNDS.values(), ids=list(BOUNDS))
def test_bounds_are_checked_on_a_transfers_first_chunk(in_flight, sender, size, error):
    book = Reassemblies()
    for i, (other, other_size) in enumerate(in_flight):
        book, outcome = book.receive(other, header(other_size, f"t{i}"), 0.0)
        assert isinstance(outcome, Pending)
    _, outcome = book.receive(sender, header(size), 0.0)
    if error is None:
        assert isinstance(outcome, Pending)
    else:
        assert isinstance(outcome, Refused) and outcome.ack.error == error


def test_an_incomplete_transfer_expires_at_its_deadline_with_a_refusal():
    book, _ = feed(GOOD[:2], now=100.0)
    assert book.expire(100.0 + TRANSFER_DEADLINE_S - 0.1)[1] == ()
    book, acks = book.expire(100.0 + TRANSFER_DEADLINE_S)
    assert [a.error for a in acks] == [TransferError.EXPIRED] and book.partials == {}
    book, outcomes = feed(GOOD, book, now=200.0)  # a resend starts over and completes
    assert isinstance(outcomes[-1], Completed)


SENT = Outgoing(node_id="b", chunks=GOOD, sent_at=0.0)
VERDICTS = {
    "acked": (SENT, 1.0, ack_for(GOOD[0]), None),
    "waiting": (SENT, ACK_DEADLINE_S - 0.1, None, None),
    "deadline: again": (SENT, ACK_DEADLINE_S, None, Resend()),
    "busy: again at the deadline": (SENT, 1.0, ack_for(GOOD[0], TransferError.RECEIVER_BUSY), None),
    "digest: again at the deadline": (SENT, 1.0, ack_for(GOOD[0], TransferError.DIGEST_MISMATCH), None),
    "too large: final": (SENT, 1.0, ack_for(GOOD[0], TransferError.TOO_LARGE, "big"), GiveUp(TransferError.TOO_LARGE, "big")),
    "no worker: final": (SENT, 1.0, ack_for(GOOD[0], TransferError.NO_WORKER, "none"),
                         GiveUp(TransferError.NO_WORKER, "none")),
}


@pytest.mark.parametrize(("outgoing", "now", "ack", "verdict"), VERDICTS.values(), ids=list(VERDICTS))
def test_sender_verdicts(outgoing, now, ack, verdict):
    assert sender_verdict(outgoing, now, ack) == verdict


@pytest.mark.parametrize("refusal", ["", "receiver_busy: full"], ids=["silence", "refused"])
def test_the_last_try_gives_up_as_lost_naming_the_last_refusal(refusal):
    last = Outgoing(node_id="b", chunks=GOOD, sent_at=0.0, tries=MAX_SEND_TRIES, last_refusal=refusal)
    verdict = sender_verdict(last, ACK_DEADLINE_S)
    assert isinstance(verdict, GiveUp) and verdict.error == TransferError.LOST and refusal in verdict.detail


def test_a_try_again_has_a_fresh_transfer_id_that_the_receiver_admits_anew():
    first = Outgoing(node_id="b", chunks=GOOD, sent_at=0.0)
    book, outcome = Reassemblies().receive("a", header(MAX_COMMAND_INPUT_BYTES + 1, first.chunks[0].transfer_id), 0.0)
    assert isinstance(outcome, Refused)
    again = first.again("t2", 10.0)
    assert (again.tries, again.sent_at, {c.transfer_id for c in again.chunks}) == (2, 10.0, {"t2"})
    _, outcomes = feed(again.chunks, book)
    assert isinstance(outcomes[-1], Completed) and outcomes[-1].item == BIG


@pytest.mark.parametrize(("raw", "dropped"), [("", frozenset()), ("2", frozenset({2})), ("0, 3", frozenset({0, 3}))])
def test_the_test_knob_names_the_chunks_the_api_node_drops(raw, dropped):
    assert dropped_input_chunks({TEST_DROP_INPUT_CHUNKS_ENV: raw}) == dropped


def test_the_test_knob_refuses_what_is_not_a_chunk_number():
    with pytest.raises(ValueError, match=TEST_DROP_INPUT_CHUNKS_ENV):
        dropped_input_chunks({TEST_DROP_INPUT_CHUNKS_ENV: "two"})
