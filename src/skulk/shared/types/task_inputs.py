"""A request's text, kept out of the cluster's State and event log.

The master needs a task's metadata (which model, which instance, how many tokens, who owns
the stream), never its text: prompts and outputs must not be written into the master's
event log or shown by `/state`. So the API node submits `GenerateText`/`RunWorkload` with
*redacted* params (each params model's `redacted()`: every piece
of caller text emptied, the shape kept), and sends the full params as a `TaskInput` over the
data plane to the node that runs the task's rank 0, once the master has bound the task to
an instance (`skulk.cluster.task_inputs`). The worker dispatches a task only when its input
has arrived (`skulk.worker.plan.dispatch_pending_tasks`).

A `TaskInput` never travels whole: its wire bytes are cut into `TaskInputChunk`s of at most
`skulk.shared.input_transfer.CHUNK_BYTES` (a text-only input is one chunk), reassembled and
checked against their SHA-256 on the serving node, which answers each transfer with one
`TaskInputAck` (ok, or the typed reason it refused). See `skulk.shared.input_transfer`.
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import Field

from skulk.shared.types.base import WireModel
from skulk.shared.types.ids import CommandId
from skulk.shared.types.tasks import WorkloadParams


class TaskInput(WireModel):
    """The full params of one command, addressed to the node that runs it: any workload's,
    told apart by `params.workload`."""

    command_id: CommandId
    params: WorkloadParams


class TransferError(StrEnum):
    """Why a transfer of a task input failed: the receiver's refusals (sent back in a
    `TaskInputAck`) and the sender's own verdicts. Values are wire spellings."""

    TOO_LARGE = "input_too_large"
    """The input is over the per-command bound: never retried."""
    RECEIVER_BUSY = "receiver_busy"
    """The receiver's in-flight bound (per sender or in total) is full: retried."""
    CHUNK_MISMATCH = "chunk_mismatch"
    """A chunk contradicts its transfer's header (count, size, digest, command): retried."""
    DIGEST_MISMATCH = "digest_mismatch"
    """The reassembled bytes do not hash to the transfer's SHA-256: retried."""
    UNDECODABLE = "undecodable"
    """The bytes hash right but are not a TaskInput (a sender on another build): not retried."""
    EXPIRED = "transfer_expired"
    """The transfer stayed incomplete past the receiver's deadline: retried."""
    NO_WORKER = "no_worker"
    """The receiving node runs no worker: not retried."""
    LOST = "transfer_lost"
    """The sender's verdict: no ack after every try."""


class TaskInputChunk(WireModel):
    """One piece of a task input's wire bytes. Every chunk repeats the transfer's header
    (`command_id`, `transfer_id`, `count`, `total_bytes`, `sha256`), so chunks may arrive in
    any order and the receiver checks each against the first it saw."""

    command_id: CommandId
    transfer_id: str = Field(min_length=1, max_length=64)
    seq: int = Field(ge=0)
    count: int = Field(ge=1)
    total_bytes: int = Field(ge=0)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    data_b64: str
    """This chunk's bytes, base64 (the wire is msgpack of JSON-mode dumps: text only)."""


class TaskInputAck(WireModel):
    """The receiver's answer to one transfer: it holds the input, verified (`ok`), or it
    refused the transfer for `error`."""

    command_id: CommandId
    transfer_id: str = Field(min_length=1, max_length=64)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    ok: bool
    error: TransferError | None = None
    detail: str = Field(default="", max_length=1024)


__all__ = ["TaskInput", "TaskInputAck", "TaskInputChunk", "TransferError"]
