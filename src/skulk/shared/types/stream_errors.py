"""Every error type a command's output stream can end with, in one place.

A stream's error type travels a long way: an engine or a runner names it, the worker puts it
in a `StreamTerminal`, or the master puts it in a `TaskFailed` event that the reducer keeps on
the task, and the API node turns it into the client's error `code` and HTTP status
(`skulk.api.errors.STREAM_ERROR_KINDS`). Writing the names as bare strings in each of those
places let them drift (two spellings of the same failure, one of them never produced). This
enum is the vocabulary; the values are the wire spellings clients already see, so the wire
is unchanged.

The set stays open at one edge: an engine that raises an exception it does not classify
reports the exception's class name (`EngineCrashed`-style names are not invented for it), so
wire fields are typed `StreamErrorType | str`. Anything not listed here is `internal` to the
API's error table.
"""

from __future__ import annotations

from enum import StrEnum


class StreamErrorType(StrEnum):
    # -- ended by the API node itself --------------------------------------------------------
    CANCELLED = "cancelled"
    """The client cancelled the command (`POST /v1/cancel/{id}` or a Cancel command)."""
    CLIENT_CLOSED = "client_closed"
    """The client went away mid-stream."""
    IDLE_TIMEOUT = "idle_timeout"
    """No output from the runner within the idle lease."""
    FIRST_FRAME_TIMEOUT = "first_frame_timeout"
    """The runner never started the stream."""
    CLIENT_TOO_SLOW = "client_too_slow"
    """The client fell too far behind the runner for the bounded buffer."""
    PROTOCOL_VIOLATION = "protocol_violation"
    """The runner's frames broke the output protocol (gap, wrong command, missing result)."""
    TERMINAL_LOST = "terminal_lost"
    """The cluster shows the task Complete, but its final frame never reached this node
    within the terminal grace (dropped on the way): the reply may be incomplete."""
    RUNNER_FAILED = "runner_failed"
    """A failed terminal that named no error type."""
    TOOL_CALL_INVALID = "tool_call_invalid"
    """The model called a strict tool with arguments that break its schema, and the call
    could not be generated again under the schema's grammar (`skulk.api.strict_tools`)."""
    INPUT_TOO_LARGE = "InputTooLarge"
    """The request's input is over the per-command transfer bound
    (`skulk.shared.input_transfer.MAX_COMMAND_INPUT_BYTES`), or the serving node refused it so."""
    INPUT_TRANSFER_LOST = "InputTransferLost"
    """The request's input never reached the serving node, acknowledged, after every try
    (no ack, the receiver busy or gone): nothing ran; the client may resend."""
    INPUT_TRANSFER_FAILED = "InputTransferFailed"
    """The serving node refused the request's input for good (not a task input its build
    reads, or it serves nothing)."""
    MASTER_FAILOVER = "MasterFailover"
    """The master changed while the command was in flight; the client should resend."""

    # -- decided by the master (TaskFailed / task status) ------------------------------------
    TASK_FAILED = "TaskFailed"
    """The master failed the task without saying why (an event from before error types were kept)."""
    TASK_CANCELLED = "TaskCancelled"
    """The task was cancelled in the cluster."""
    NODE_LOST = "NodeLost"
    """A node holding part of the task's instance left or timed out."""
    INSTANCE_GONE = "InstanceGone"
    """The task's instance was deleted while the task was still open."""
    PLACEMENT_REFUSED = "PlacementRefused"
    """A node refused the instance's placement; the instance is being re-placed."""
    DOWNLOAD_FAILED = "DownloadFailed"
    """A node could not get the model's files."""
    GROUP_BROKEN = "GroupBroken"
    """A multi-node group lost a member or failed to form."""

    # -- reported by a runner or its engine --------------------------------------------------
    RUNNER_CRASHED = "RunnerCrashed"
    RUNNER_SHUTDOWN = "RunnerShutdown"
    RUNNER_UNAVAILABLE = "RunnerUnavailable"
    RUNNER_BUSY = "RunnerBusy"
    ENGINE_ERROR = "EngineError"
    ENGINE_BROKEN = "EngineBroken"
    ENGINE_NOT_LOADED = "EngineNotLoaded"
    ENGINE_BUSY = "EngineBusy"
    ENGINE_UNAVAILABLE = "EngineUnavailable"
    ENGINE_BINARY_MISSING = "EngineBinaryMissing"
    ENGINE_PORT_TAKEN = "EnginePortTaken"
    ENGINE_START_FAILED = "EngineStartFailed"
    MODEL_LOAD_FAILED = "ModelLoadFailed"
    CHAT_TEMPLATE_MISSING = "ChatTemplateMissing"
    WORKLOAD_UNSUPPORTED = "WorkloadUnsupported"
    EMBEDDING_FAILED = "EmbeddingFailed"
    CONTEXT_LENGTH_EXCEEDED = "ContextLengthExceeded"
    INVALID_REQUEST = "InvalidRequest"
    INVALID_SLOT_COUNT = "InvalidSlotCount"
    GROUP_FORMATION_FAILED = "GroupFormationFailed"
    POOL_MEMBER_LOST = "PoolMemberLost"
    """A llama.cpp pool's driver lost a donor (its node or runner); the pool is re-placed."""


def stream_error_type(value: str) -> StreamErrorType | str:
    """The enum member for a wire value, or the value itself when it is a foreign name (an
    unclassified exception's class name)."""
    try:
        return StreamErrorType(value)
    except ValueError:
        return value


__all__ = ["StreamErrorType", "stream_error_type"]
