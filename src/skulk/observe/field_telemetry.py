"""Opt-in field telemetry, the pure part: what a sample may hold, when collection is on, and
the bounded queue of samples waiting to be sent, as data (docs/TELEMETRY.md).

What it is for: anonymous speed and reliability numbers (time to first token, decode speed,
token counts, failure classes, peer-observed node losses, each by model and hardware class)
that an operator chooses to send. What it must never do: let a prompt, an output, a node id,
a node or host name, an address, a key, or a name the operator made up reach a sample. Each
sample is built field by field from an allowlist (`generation_sample`, `node_lost_sample`);
free text is never copied, only mapped onto fixed vocabularies:

- `model`: the id of a built-in model card (shipped with Skulk, so it names no one's files),
  else `custom` (any card an operator added, a local path, a hub repo id, which may be a
  private repo's name);
- `hardware`: canonical hardware classes (`skulk.shared.hardware_class`), re-checked for
  their shape here, else `unknown`;
- `outcome`: completed, failed, cancelled, client_closed;
- `failure`: a `StreamErrorType` value, else `other` (an engine's unclassified exception name
  never leaves).

The shell (`skulk.observe.field_collector`) owns time, files and the network; everything it
decides comes from here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Annotated, Final, Literal

from pydantic import Field

from skulk.shared.hardware_class import UNKNOWN_HARDWARE, is_hardware_class
from skulk.shared.settings import setting
from skulk.shared.telemetry_view import TelemetryView
from skulk.shared.types.base import WireModel
from skulk.shared.types.common import NonNegInt
from skulk.shared.types.events import NodeTimedOut
from skulk.shared.types.ids import NodeId
from skulk.shared.types.state import State
from skulk.shared.types.stream_errors import StreamErrorType

SCHEMA_VERSION: Final = 1
"""The batch format's version (`schemaVersion`); the ingest refuses formats it does not know."""

DISABLE_ENV: Final = "SKULK_TELEMETRY_DISABLE"
"""Set (to anything but 0/false/no/off), no telemetry from this node, whatever else says."""

MAX_PENDING_SAMPLES: Final = 1000
"""Samples kept waiting to be sent at most. A full queue drops the new sample and counts it:
about 16 a second for a minute between flushes, more than one API node serves; when the
endpoint is unreachable for long, memory stays bounded."""

MAX_BATCH_SAMPLES: Final = 500
"""Samples in one POST at most (about 100 KB of JSON); the rest go in the next flush."""

SEND_DEADLINE_S: Final = 10.0
"""One POST's whole budget (connect, send, answer). Telemetry never waits longer than this,
and never on a request's path."""

MAX_HARDWARE_PER_SAMPLE: Final = 16
"""Hardware classes listed on one generation at most (the nodes of one instance)."""

CUSTOM_MODEL: Final = "custom"
"""The `model` of any generation whose model is not a built-in card."""

OTHER_FAILURE: Final = "other"
"""The `failure` of an error type outside `StreamErrorType`."""

Outcome = Literal["completed", "failed", "cancelled", "client_closed"]
OUTCOMES: Final[frozenset[str]] = frozenset({"completed", "failed", "cancelled", "client_closed"})
_FAILURE_CLASSES: Final[frozenset[str]] = frozenset(e.value for e in StreamErrorType)


# -- the switch ------------------------------------------------------------------------------


def env_disables_telemetry(env: Mapping[str, str] | None = None) -> bool:
    """Whether SKULK_TELEMETRY_DISABLE is set. Any value but 0/false/no/off (or empty) counts:
    an operator who set it meant off."""
    raw = setting(DISABLE_ENV, env).lower()
    return bool(raw) and raw not in ("0", "false", "no", "off")


def telemetry_enabled(configured: bool, consent: bool | None, env_disabled: bool) -> bool:
    """Whether this node collects and sends samples now: never when the environment disables
    it; else the operator's latest word, the dashboard's switch this run (`consent`, None
    when not used) over skulk.yaml's `telemetry.enabled` read at start."""
    if env_disabled:
        return False
    return consent if consent is not None else configured


# -- samples ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class StreamEnded:
    """One command stream's end as the API node saw it (`skulk.api.streams`): the input of
    `generation_sample`. Holds a command id and a model id as typed, so it is never sent."""

    command_id: str
    model_id: str
    workload: str
    """'text' for a generation; a one-result workload's kind ('embeddings', 'echo') otherwise."""
    outcome: str
    error_type: str | None = None
    first_output_s: float | None = None
    """From the stream's opening to its first output chunk (None: no output)."""
    decode_s: float | None = None
    """From the first output chunk to the last."""
    output_chunks: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0


class GenerationSample(WireModel):
    """One ended text generation."""

    kind: Literal["generation"] = "generation"
    model: str
    """A built-in card's model id, or `custom`."""
    hardware: list[str]
    """The hardware classes of the nodes that served it, sorted (several for a sharded model)."""
    outcome: Outcome
    failure: str | None = None
    """On a failed generation, its `StreamErrorType` value (or `other`)."""
    ttft_ms: NonNegInt | None = None
    """Time to first token: from the request's submission to its first output, milliseconds."""
    decode_tokens_per_s: float | None = None
    """Generated tokens after the first, over the time from the first output to the last."""
    prompt_tokens: NonNegInt = 0
    completion_tokens: NonNegInt = 0
    cached_tokens: NonNegInt = 0
    """Prompt tokens whose KV came from the prefix cache."""


class NodeLostSample(WireModel):
    """A member the cluster pruned (it crashed, hung or lost its network), counted once by
    the master that pruned it: a dead node cannot report itself."""

    kind: Literal["node_lost"] = "node_lost"
    hardware: str
    cause: Literal["silence", "presence_lost"]


Sample = Annotated[GenerationSample | NodeLostSample, Field(discriminator="kind")]


class TelemetryBatch(WireModel):
    """What one POST carries, and what `GET /v1/telemetry/preview` shows, byte for byte."""

    schema_version: int = SCHEMA_VERSION
    install_id: str | None
    """The random id of this installation (created when the operator opted in): the key to
    ask for deletion of everything it sent. None until then."""
    skulk_version: str
    samples: list[Sample]
    dropped: NonNegInt = 0
    """Samples this node dropped since its last accepted batch (a full queue, a refused batch)."""


def public_model_id(model_id: str, builtin_model_ids: frozenset[str]) -> str:
    """The model id a sample may carry: a built-in card's, else `custom`."""
    return model_id if model_id in builtin_model_ids else CUSTOM_MODEL


def failure_class(outcome: str, error_type: str | None) -> str | None:
    """A failed generation's class from the fixed vocabulary; None for any other outcome."""
    if outcome != "failed":
        return None
    return error_type if error_type in _FAILURE_CLASSES else OTHER_FAILURE


def public_hardware(classes: Sequence[str | None]) -> list[str]:
    """`classes` with anything not shaped like a hardware class as `unknown`, sorted, bounded."""
    return sorted(c if c is not None and is_hardware_class(c) else UNKNOWN_HARDWARE
                  for c in classes)[:MAX_HARDWARE_PER_SAMPLE]


def decode_tokens_per_s(ended: StreamEnded) -> float | None:
    tokens = ended.completion_tokens or ended.output_chunks
    if tokens < 2 or ended.decode_s is None or ended.decode_s <= 0:
        return None
    return round((tokens - 1) / ended.decode_s, 2)


def generation_sample(ended: StreamEnded, builtin_model_ids: frozenset[str],
                      hardware: Sequence[str | None]) -> GenerationSample | None:
    """The sample of one ended stream (None: not a text generation, or an unknown outcome).
    Built from the allowlist only: nothing of `ended` is copied that is not a count, a time
    or a value of a fixed vocabulary."""
    if ended.workload != "text" or ended.outcome not in OUTCOMES:
        return None
    ttft = ended.first_output_s
    return GenerationSample(
        model=public_model_id(ended.model_id, builtin_model_ids),
        hardware=public_hardware(hardware),
        outcome=ended.outcome,  # pyright: ignore[reportArgumentType]  # checked in OUTCOMES above
        failure=failure_class(ended.outcome, ended.error_type),
        ttft_ms=round(ttft * 1000) if ttft is not None and ttft >= 0 else None,
        decode_tokens_per_s=decode_tokens_per_s(ended),
        prompt_tokens=max(0, ended.prompt_tokens),
        completion_tokens=max(0, ended.completion_tokens or ended.output_chunks),
        cached_tokens=max(0, ended.cached_tokens),
    )


def node_lost_sample(event: object, i_am_master: bool, hardware_of: Mapping[NodeId, str | None]) -> NodeLostSample | None:
    """The sample of a member's loss, counted by the master that pruned it (every member
    applies the same event; counting on the master alone counts each loss once). A clean
    stop (`NodeLeft`) is not a loss."""
    if not i_am_master or not isinstance(event, NodeTimedOut):
        return None
    (hardware,) = public_hardware([hardware_of.get(event.node_id)])
    return NodeLostSample(hardware=hardware, cause=event.cause)


def hardware_classes(view: TelemetryView) -> dict[NodeId, str | None]:
    """Every node's hardware class as its latest `NodeResources` said (None: not said)."""
    return {node_id: node.resources.hardware_class if node.resources is not None else None
            for node_id, node in view.nodes.items()}


def serving_hardware(state: State, hardware_of: Mapping[NodeId, str | None], command_id: str,
                     model_id: str) -> list[str | None]:
    """The hardware classes of the nodes that ran `command_id`: its task's instance while
    State still has the task, else the model's first placed instance."""
    instance = None
    for task in state.tasks.values():
        if getattr(task, "command_id", None) == command_id:
            instance = state.instances.get(task.instance_id)
            break
    if instance is None:
        placed = sorted((i for i in state.instances.values() if i.model_id == model_id), key=lambda i: i.instance_id)
        instance = placed[0] if placed else None
    if instance is None:
        return []
    return [hardware_of.get(node_id) for node_id in sorted(set(instance.node_ids()))]


# -- the queue, as data ----------------------------------------------------------------------


@dataclass(frozen=True)
class Pending:
    """Samples waiting to be sent, oldest first, and those dropped since the last accepted
    batch. `epoch` changes when the queue is cleared (collection turned off), so the answer
    to a send that was in flight meanwhile cannot remove samples collected since."""

    samples: tuple[GenerationSample | NodeLostSample, ...] = ()
    dropped: int = 0
    epoch: int = 0


def admit(pending: Pending, sample: GenerationSample | NodeLostSample,
          capacity: int = MAX_PENDING_SAMPLES) -> Pending:
    """`pending` with `sample` queued; at capacity the new sample is dropped and counted."""
    if len(pending.samples) >= capacity:
        return replace(pending, dropped=pending.dropped + 1)
    return replace(pending, samples=(*pending.samples, sample))


def cleared(pending: Pending) -> Pending:
    """Nothing pending (collection was turned off): what was collected is never sent."""
    return Pending(epoch=pending.epoch + 1)


def next_batch(pending: Pending, install_id: str | None, version: str,
               max_samples: int = MAX_BATCH_SAMPLES) -> TelemetryBatch:
    """The batch the next flush sends (and the preview shows): the oldest samples."""
    return TelemetryBatch(install_id=install_id, skulk_version=version,
                          samples=list(pending.samples[:max_samples]), dropped=pending.dropped)


SendResult = Literal["sent", "retry", "refused"]


def send_result(status_code: int | None) -> SendResult:
    """What an answer means for the batch: 2xx sent; no answer (timeout, no route), 408, 429
    or 5xx: keep it for the next flush; any other 4xx: the ingest will never take it, drop it."""
    if status_code is None or status_code in (408, 429) or status_code >= 500:
        return "retry"
    if 200 <= status_code < 300:
        return "sent"
    return "refused"


def after_send(pending: Pending, batch: TelemetryBatch, result: SendResult, epoch: int) -> Pending:
    """`pending` once `batch` (taken at `epoch`) was answered: sent or refused samples leave
    the queue (refused ones counted as dropped); a retry keeps them. A queue cleared while the
    batch was in flight stays as it is."""
    if epoch != pending.epoch or result == "retry":
        return pending
    taken = len(batch.samples)
    rest = pending.samples[taken:]
    if result == "sent":
        return replace(pending, samples=rest, dropped=max(0, pending.dropped - batch.dropped))
    return replace(pending, samples=rest, dropped=pending.dropped + taken)


# -- what the routes answer ------------------------------------------------------------------


class TelemetryCounters(WireModel):
    sent_batches: NonNegInt = 0
    sent_samples: NonNegInt = 0
    failed_sends: NonNegInt = 0
    """POSTs that got no answer or a 5xx/408/429 (their samples wait for the next flush)."""
    refused_batches: NonNegInt = 0
    dropped_samples: NonNegInt = 0
    """Samples dropped: the queue was full, or the ingest refused their batch."""


class TelemetryStatus(WireModel):
    """`GET /v1/telemetry` and the answer of `PUT /v1/telemetry`."""

    enabled: bool
    """Collecting and sending now (the operator opted in and the environment does not forbid it)."""
    consent: bool
    """The operator's choice (skulk.yaml's `telemetry.enabled`, or the switch this run)."""
    disabled_by_env: bool
    env_variable: str = DISABLE_ENV
    endpoint: str
    flush_seconds: float
    install_id: str | None
    pending: NonNegInt
    capacity: NonNegInt = MAX_PENDING_SAMPLES
    counters: TelemetryCounters


class TelemetryPreview(WireModel):
    """`GET /v1/telemetry/preview`: the batch the next flush would POST, exactly."""

    enabled: bool
    disabled_by_env: bool
    endpoint: str
    batch: TelemetryBatch


class TelemetrySwitch(WireModel):
    """`PUT /v1/telemetry`'s body."""

    enabled: bool


__all__ = [
    "CUSTOM_MODEL",
    "DISABLE_ENV",
    "MAX_BATCH_SAMPLES",
    "MAX_PENDING_SAMPLES",
    "OTHER_FAILURE",
    "SCHEMA_VERSION",
    "SEND_DEADLINE_S",
    "GenerationSample",
    "NodeLostSample",
    "Pending",
    "Sample",
    "SendResult",
    "StreamEnded",
    "TelemetryBatch",
    "TelemetryCounters",
    "TelemetryPreview",
    "TelemetryStatus",
    "TelemetrySwitch",
    "admit",
    "after_send",
    "cleared",
    "env_disables_telemetry",
    "failure_class",
    "generation_sample",
    "hardware_classes",
    "next_batch",
    "node_lost_sample",
    "public_hardware",
    "public_model_id",
    "send_result",
    "serving_hardware",
    "telemetry_enabled",
]
