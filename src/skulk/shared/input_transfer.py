"""Chunked, digest-checked, acknowledged transfer of task inputs: the pure core.

A request's full params (its text, its images as base64, its uploaded audio) travel from the
API node to the node that runs the task's rank 0 on the data plane, never through the
master, State or disk. Whole, such an input could be tens of MiB in one message; so it is
cut into chunks of at most `CHUNK_BYTES` (`split`), the receiver keeps the chunks in memory
until the transfer is complete (`Reassemblies.receive`), checks the SHA-256 of the whole and
answers with one `TaskInputAck`; the sender keeps the transfer until that ack and sends it
again, under a fresh transfer id, when none comes in time (`sender_verdict`).

Every bound is named here, and this module never reads the clock, a socket or a file: the
shells (`skulk.cluster.task_inputs.TaskInputRelay` on the API node,
`skulk.worker.task_inputs.InputAssembler` on the serving node) pass `now` in.

Failures a transfer can meet, all `TransferError`s:

    TransferError
    ├── TOO_LARGE        input over MAX_COMMAND_INPUT_BYTES (sender refuses it; receiver too)
    ├── RECEIVER_BUSY    MAX_SENDER_IN_FLIGHT_BYTES or MAX_IN_FLIGHT_BYTES full   (retried)
    ├── CHUNK_MISMATCH   a chunk contradicts its transfer's header                 (retried)
    ├── DIGEST_MISMATCH  the whole does not hash to its SHA-256                    (retried)
    ├── UNDECODABLE      the bytes are not a TaskInput                           (final)
    ├── EXPIRED          incomplete after TRANSFER_DEADLINE_S                      (retried)
    ├── NO_WORKER        the receiving node serves nothing                         (final)
    └── LOST             no ack after MAX_SEND_TRIES tries of ACK_DEADLINE_S       (final)
"""

from __future__ import annotations

import base64
import hashlib
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Final

from pydantic import ValidationError

from skulk.shared.settings import setting
from skulk.shared.types.stream_errors import StreamErrorType
from skulk.shared.types.task_inputs import TaskInput, TaskInputAck, TaskInputChunk, TransferError
from skulk.shared.types.workload_io import MAX_AUDIO_UPLOAD_BYTES

MIB: Final = 1024 * 1024

CHUNK_BYTES: Final = 1 * MIB
"""Largest piece of an input's bytes in one message (base64 on the wire: ~1.34 MiB, inside
the `task_inputs` topic's 2 MiB bound). Small enough that one large input does not hold the
data plane's reliable queue for long, large enough that a 25 MiB upload is 34 messages."""

MAX_COMMAND_INPUT_BYTES: Final = 80 * MIB
"""Largest serialized input (its wire bytes) of one command. The issue's "32 MiB a command"
is the media: the API refuses a request whose images total more than 32 MiB
(`skulk.api.media.MAX_REQUEST_IMAGE_BYTES`), and an upload over 25 MiB
(`MAX_AUDIO_UPLOAD_BYTES`). In the params they travel as base64 (32 MiB of images is 42.7
MiB) beside the request's text (a body of at most `body_limits.MAX_MAX_BODY_BYTES`, 32 MiB),
so the transfer bound is 80 MiB: every request the API accepts fits (asserted in
`skulk.api.media`), and anything bigger is refused by name (`TransferError.TOO_LARGE`)."""

MAX_SENDER_IN_FLIGHT_BYTES: Final = 256 * MIB
"""Incomplete-transfer bytes one receiver reserves for one sending node: one busy API node
cannot take the whole in-flight budget from the others."""

MAX_IN_FLIGHT_BYTES: Final = 512 * MIB
"""Incomplete-transfer bytes one receiver reserves in total (each transfer reserves its
`total_bytes` at its first chunk). Past it a new transfer is refused `RECEIVER_BUSY`."""

MAX_HELD_TRANSFER_BYTES: Final = 512 * MIB
"""Bytes one API node keeps for transfers sent and not yet acknowledged; past it the oldest
is given up (`LOST`), so memory stays bounded when receivers stop answering."""

TRANSFER_DEADLINE_S: Final = 30.0
"""An incomplete transfer is dropped this long after its first chunk arrived (its sender
sends it again after `ACK_DEADLINE_S`, and a resent chunk starts a new reassembly)."""

ACK_DEADLINE_S: Final = 10.0
"""How long the sender waits for a transfer's ack before sending the whole transfer again.
The largest input (80 MiB) needs 8.4 MB/s to arrive in time: a tenth of gigabit Ethernet."""

MAX_SEND_TRIES: Final = 3
"""Tries of one transfer (the first send included) before the sender gives it up as `LOST`
and fails the command's stream."""

RETRIED: Final = frozenset({TransferError.RECEIVER_BUSY, TransferError.CHUNK_MISMATCH,
                            TransferError.DIGEST_MISMATCH, TransferError.EXPIRED})
"""Refusals worth another try (transient), at the sender's next deadline; the others end the
command at once."""

INPUT_STREAM_ERRORS: Final[Mapping[TransferError, StreamErrorType]] = MappingProxyType({
    TransferError.TOO_LARGE: StreamErrorType.INPUT_TOO_LARGE,
    TransferError.RECEIVER_BUSY: StreamErrorType.INPUT_TRANSFER_LOST,
    TransferError.CHUNK_MISMATCH: StreamErrorType.INPUT_TRANSFER_LOST,
    TransferError.DIGEST_MISMATCH: StreamErrorType.INPUT_TRANSFER_LOST,
    TransferError.EXPIRED: StreamErrorType.INPUT_TRANSFER_LOST,
    TransferError.LOST: StreamErrorType.INPUT_TRANSFER_LOST,
    TransferError.UNDECODABLE: StreamErrorType.INPUT_TRANSFER_FAILED,
    TransferError.NO_WORKER: StreamErrorType.INPUT_TRANSFER_FAILED,
})
"""The stream error a command ends with when its input transfer fails for each reason."""

assert set(INPUT_STREAM_ERRORS) == set(TransferError), "every transfer failure ends its stream typed"
assert (MAX_AUDIO_UPLOAD_BYTES + 2) // 3 * 4 < MAX_COMMAND_INPUT_BYTES, "an accepted upload must fit one transfer"


TEST_DROP_INPUT_CHUNKS_ENV: Final = "SKULK_TEST_API_DROPS_INPUT_CHUNKS"
"""Test-only knob: comma-separated chunk numbers (`seq`) the API node never publishes, on
every try, so a real-process test sees a transfer lost deterministically (the client gets
`InputTransferLost` after `MAX_SEND_TRIES`). Never set it in production."""


def dropped_input_chunks(env: Mapping[str, str] | None = None) -> frozenset[int]:
    """The chunk numbers the test knob drops: none unless it is set."""
    raw = setting(TEST_DROP_INPUT_CHUNKS_ENV, os.environ if env is None else env)
    try:
        return frozenset(int(part) for part in raw.split(",") if part.strip())
    except ValueError:
        raise ValueError(f"{TEST_DROP_INPUT_CHUNKS_ENV}={raw!r} is not a list of chunk numbers") from None


# -- sender ---------------------------------------------------------------------------------

def encode_input(item: TaskInput) -> bytes:
    """The input's wire bytes (its camelCase JSON): what is chunked and hashed."""
    return item.model_dump_json(by_alias=True).encode()


def split(item: TaskInput, transfer_id: str, chunk_bytes: int = CHUNK_BYTES) -> tuple[TaskInputChunk, ...] | TransferError:
    """The chunks of one transfer of `item`, or TOO_LARGE. An empty input is still one chunk."""
    data = encode_input(item)
    if len(data) > MAX_COMMAND_INPUT_BYTES:
        return TransferError.TOO_LARGE
    digest = hashlib.sha256(data).hexdigest()
    pieces = [data[start:start + chunk_bytes] for start in range(0, len(data), chunk_bytes)] or [b""]
    return tuple(
        TaskInputChunk(command_id=item.command_id, transfer_id=transfer_id, seq=seq, count=len(pieces),
                       total_bytes=len(data), sha256=digest, data_b64=base64.b64encode(piece).decode())
        for seq, piece in enumerate(pieces)
    )


@dataclass(frozen=True)
class Outgoing:
    """One transfer sent and not acknowledged yet."""

    node_id: str
    chunks: tuple[TaskInputChunk, ...]
    sent_at: float
    tries: int = 1
    last_refusal: str = ""
    """The receiver's last transient refusal of this input, for the final error's detail."""

    @property
    def size_bytes(self) -> int:
        return self.chunks[0].total_bytes

    def again(self, transfer_id: str, now: float) -> Outgoing:
        """The next try, under a fresh transfer id: the receiver answers each id once (a
        refusal it remembered must not answer the new try), and chunks of the old try that
        arrive late complete nothing."""
        chunks = tuple(chunk.model_copy(update={"transfer_id": transfer_id}) for chunk in self.chunks)
        return replace(self, chunks=chunks, sent_at=now, tries=self.tries + 1)


@dataclass(frozen=True)
class Resend:
    pass


@dataclass(frozen=True)
class GiveUp:
    error: TransferError
    detail: str


Verdict = Resend | GiveUp | None


def sender_verdict(outgoing: Outgoing, now: float, ack: TaskInputAck | None = None) -> Verdict:
    """What the sender does with a transfer: None (done when `ack` is ok, else keep
    waiting), send it again, or give it up. `ack` is the receiver's answer when one just came;
    a transient refusal waits for the deadline like a lost transfer (a busy receiver is not
    asked again at once); without an ack, the deadline decides."""
    if ack is not None:
        if ack.ok:
            return None
        error = ack.error or TransferError.CHUNK_MISMATCH
        return None if error in RETRIED else GiveUp(error, ack.detail or error.value)
    if now - outgoing.sent_at < ACK_DEADLINE_S:
        return None
    if outgoing.tries >= MAX_SEND_TRIES:
        last = f"; last refusal: {outgoing.last_refusal}" if outgoing.last_refusal else ""
        return GiveUp(TransferError.LOST, f"no acknowledgement from node {outgoing.node_id} after "
                                          f"{outgoing.tries} tries of {ACK_DEADLINE_S:.0f} s{last}")
    return Resend()


# -- receiver -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Partial:
    """The chunks of one transfer received so far, checked against the first chunk's header."""

    sender: str
    header: TaskInputChunk
    started_at: float
    pieces: Mapping[int, bytes] = field(default_factory=lambda: MappingProxyType({}))

    def contradicts(self, chunk: TaskInputChunk) -> bool:
        h = self.header
        return (chunk.command_id, chunk.count, chunk.total_bytes, chunk.sha256) != (
            h.command_id, h.count, h.total_bytes, h.sha256) or chunk.seq >= h.count


@dataclass(frozen=True)
class Pending:
    """Kept; the transfer is not complete."""


@dataclass(frozen=True)
class Duplicate:
    """A chunk already held, or one of a transfer already answered: ignored (re-acked once
    complete, so a lost ack is answered again when the sender resends)."""

    ack: TaskInputAck | None = None


@dataclass(frozen=True)
class Completed:
    item: TaskInput
    ack: TaskInputAck


@dataclass(frozen=True)
class Refused:
    ack: TaskInputAck


Received = Pending | Duplicate | Completed | Refused

MAX_ANSWERED: Final = 1024
"""Transfers whose ack a receiver remembers, to answer a resent transfer again (oldest
forgotten first); a few minutes of a busy node's inputs."""


def ack_for(chunk: TaskInputChunk, error: TransferError | None = None, detail: str = "") -> TaskInputAck:
    return TaskInputAck(command_id=chunk.command_id, transfer_id=chunk.transfer_id, sha256=chunk.sha256,
                        ok=error is None, error=error, detail=detail[:1024])


@dataclass(frozen=True)
class Reassemblies:
    """The receiver's transfers in flight (by transfer id), and the acks of recent finished
    ones. A value: `receive` and `expire` return a new one."""

    partials: Mapping[str, Partial] = field(default_factory=lambda: MappingProxyType({}))
    answered: Mapping[str, TaskInputAck] = field(default_factory=lambda: MappingProxyType({}))

    def in_flight_bytes(self, sender: str | None = None) -> int:
        return sum(p.header.total_bytes for p in self.partials.values() if sender is None or p.sender == sender)

    def _with(self, partials: dict[str, Partial] | None = None, answered: TaskInputAck | None = None) -> Reassemblies:
        new_answered = dict(self.answered)
        if answered is not None:
            new_answered[answered.transfer_id] = answered
            while len(new_answered) > MAX_ANSWERED:
                del new_answered[next(iter(new_answered))]
        return Reassemblies(MappingProxyType(partials if partials is not None else dict(self.partials)),
                            MappingProxyType(new_answered))

    def _finish(self, chunk: TaskInputChunk, ack: TaskInputAck) -> Reassemblies:
        partials = dict(self.partials)
        partials.pop(chunk.transfer_id, None)
        return self._with(partials, answered=ack)

    def receive(self, sender: str, chunk: TaskInputChunk, now: float) -> tuple[Reassemblies, Received]:
        answered = self.answered.get(chunk.transfer_id)
        if answered is not None:
            # A resend of a finished transfer: answer once per resend (on its last chunk).
            return self, Duplicate(answered if chunk.seq == chunk.count - 1 else None)
        partial = self.partials.get(chunk.transfer_id)
        if partial is None:
            refusal = _admission(self, sender, chunk)
            if refusal is not None:
                ack = ack_for(chunk, *refusal)
                return self._finish(chunk, ack), Refused(ack)
            partial = Partial(sender=sender, header=chunk, started_at=now)
        elif partial.contradicts(chunk) or partial.sender != sender:
            ack = ack_for(chunk, TransferError.CHUNK_MISMATCH,
                          f"chunk {chunk.seq} of transfer {chunk.transfer_id} contradicts its header")
            return self._finish(chunk, ack), Refused(ack)
        if chunk.seq in partial.pieces:
            return self, Duplicate()
        try:
            piece = base64.b64decode(chunk.data_b64, validate=True)
        except ValueError:
            ack = ack_for(chunk, TransferError.CHUNK_MISMATCH, f"chunk {chunk.seq} is not base64")
            return self._finish(chunk, ack), Refused(ack)
        held = sum(len(p) for p in partial.pieces.values()) + len(piece)
        if held > chunk.total_bytes:
            ack = ack_for(chunk, TransferError.CHUNK_MISMATCH, f"chunks exceed the transfer's {chunk.total_bytes} bytes")
            return self._finish(chunk, ack), Refused(ack)
        partial = replace(partial, pieces=MappingProxyType({**partial.pieces, chunk.seq: piece}))
        if len(partial.pieces) < chunk.count:
            partials = dict(self.partials)
            partials[chunk.transfer_id] = partial
            return self._with(partials), Pending()
        outcome = _assemble(partial)
        return self._finish(chunk, outcome.ack), outcome

    def expire(self, now: float) -> tuple[Reassemblies, tuple[TaskInputAck, ...]]:
        """Drop the transfers incomplete for `TRANSFER_DEADLINE_S`; their refusals (EXPIRED),
        to send back so the sender retries at once instead of waiting out its deadline."""
        late = [p for p in self.partials.values() if now - p.started_at >= TRANSFER_DEADLINE_S]
        if not late:
            return self, ()
        partials = {tid: p for tid, p in self.partials.items() if now - p.started_at < TRANSFER_DEADLINE_S}
        acks = tuple(ack_for(p.header, TransferError.EXPIRED,
                             f"{len(p.pieces)} of {p.header.count} chunks after {TRANSFER_DEADLINE_S:.0f} s")
                     for p in late)
        return Reassemblies(MappingProxyType(partials), self.answered), acks


def _admission(book: Reassemblies, sender: str, chunk: TaskInputChunk) -> tuple[TransferError, str] | None:
    """Why a new transfer is refused at its first chunk, or None: the bounds, checked on the
    size its header declares (reserved whole, so a transfer admitted can complete)."""
    if chunk.total_bytes > MAX_COMMAND_INPUT_BYTES:
        return TransferError.TOO_LARGE, f"{chunk.total_bytes} bytes > {MAX_COMMAND_INPUT_BYTES} a command"
    if chunk.count > max(1, chunk.total_bytes):  # every chunk but an empty input's carries a byte
        return TransferError.CHUNK_MISMATCH, f"{chunk.count} chunks cannot make {chunk.total_bytes} bytes"
    if book.in_flight_bytes(sender) + chunk.total_bytes > MAX_SENDER_IN_FLIGHT_BYTES:
        return TransferError.RECEIVER_BUSY, f"{MAX_SENDER_IN_FLIGHT_BYTES} bytes already in flight from node {sender}"
    if book.in_flight_bytes() + chunk.total_bytes > MAX_IN_FLIGHT_BYTES:
        return TransferError.RECEIVER_BUSY, f"{MAX_IN_FLIGHT_BYTES} bytes already in flight"
    return None


def _assemble(partial: Partial) -> Completed | Refused:
    header = partial.header
    data = b"".join(partial.pieces[seq] for seq in range(header.count))
    if len(data) != header.total_bytes or hashlib.sha256(data).hexdigest() != header.sha256:
        return Refused(ack_for(header, TransferError.DIGEST_MISMATCH,
                               f"{len(data)} bytes do not hash to the transfer's SHA-256"))
    try:
        item = TaskInput.model_validate_json(data)
    except ValidationError as exc:
        return Refused(ack_for(header, TransferError.UNDECODABLE, f"not a task input: {exc.error_count()} errors"))
    if item.command_id != header.command_id:
        return Refused(ack_for(header, TransferError.UNDECODABLE, "the input names another command"))
    return Completed(item, ack_for(header))


__all__ = [
    "ACK_DEADLINE_S",
    "CHUNK_BYTES",
    "INPUT_STREAM_ERRORS",
    "MAX_ANSWERED",
    "MAX_COMMAND_INPUT_BYTES",
    "MAX_HELD_TRANSFER_BYTES",
    "MAX_IN_FLIGHT_BYTES",
    "MAX_SENDER_IN_FLIGHT_BYTES",
    "MAX_SEND_TRIES",
    "RETRIED",
    "TEST_DROP_INPUT_CHUNKS_ENV",
    "TRANSFER_DEADLINE_S",
    "Completed",
    "Duplicate",
    "GiveUp",
    "Outgoing",
    "Partial",
    "Pending",
    "Reassemblies",
    "Received",
    "Refused",
    "Resend",
    "Verdict",
    "ack_for",
    "dropped_input_chunks",
    "encode_input",
    "sender_verdict",
    "split",
]
