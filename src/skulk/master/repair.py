"""Self-healing placements: what the master decides when a placed instance cannot come up
or loses a node.

Five causes, one shape. A worker's pre-spawn memory guard refuses its shard (the
RefuseInstancePlacement command), a rank's model download fails terminally (a
DownloadFailed outcome in State for a node and model of an instance that is not serving
yet), a node hosting a rank is lost (timed out or no longer a member; `skulk.master.plan`
detects it), or a rank of a multi-rank group that was serving fails while its node stays up. Either way the master fails the instance's open requests with the reason, tears
it down (every TaskFailed before the InstanceDeleted, as in `skulk.master.plan`), and
re-places the model:

- refusal of an original placement (hop 0): one node wider (min_nodes = its width + 1),
  same sharding, same exclusions, so each node holds a smaller share; when no wider
  placement exists, straight to the fallback;
- refusal of a wider re-placement (hop 1), or no wider placement: a single node that is not
  the refuser (hop 2);
- refusal at hop 2: terminal. InstanceRepairAbandoned records why (visible in
  `State.repair_failures`) and nothing is placed, so a chain of refusals is bounded at
  MAX_REPAIR_HOP and can never oscillate between two refusing nodes;
- download failure: the same width without the failed node(s); the failed record is reset
  to pending so it does not condemn later placements touching that node; when no healthy
  set remains the master stops at the teardown (InstanceRepairAbandoned);
- broken group: the same width and sharding under a fresh instance id (fresh ring ports),
  one repair hop further; past MAX_REPAIR_HOP, InstanceRepairAbandoned;
- a runner its worker gave up on (the crash breaker tripped; its node stays up): its width,
  then narrower, without the failing node(s), which are stamped as exclusions on the new
  instance; one repair hop further each time. Nothing admits it, or past MAX_REPAIR_HOP:
  InstanceRepairAbandoned, and the instance is *kept*, Failed, so requests get the typed
  503 naming the runner's state and reason (`repair_given_up`);
- lost node: the same sharding on the surviving members, the original width first, then
  narrower down to one node; the lost node(s) are never candidates. Nothing fits:
  InstanceRepairAbandoned, and nothing is placed. The repair hop is kept (a loss is not a
  refusal), and each loss removes a member, so the chain is bounded by the cluster's size.
  A lost node is not stamped as an exclusion: it is no longer a member, and the same id
  returning (a healed partition) should be eligible again.

The operator's exclusions stamped on the instance survive every repair; a repair adds the
node it routed around to them. Telemetry lags a teardown by a few gossip rounds, so the
re-placement is credited with the memory the torn-down instance's loaded shards held, and the
shell keeps crediting every deleted instance for CREDIT_GRACE_S (`DeletionCredit`); the
worker's own guard stays the last-resort check against an over-credit.

Pure: State, cards and telemetry readings in, events out. Ids come from the injected
`new_id`; time is passed in by the shell. Never reads a clock, never does I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from skulk.master.placement import PlacementError, PlacementRequest, place
from skulk.shared.memory_estimate import assignment_footprint
from skulk.shared.serving import serving
from skulk.shared.types.cards import ModelCard
from skulk.shared.types.commands import RefuseInstancePlacement
from skulk.shared.types.common import TERMINAL_TASK_STATUSES
from skulk.shared.types.events import (
    DownloadPending,
    Event,
    InstanceCreated,
    InstanceDeleted,
    InstancePlacementRefused,
    InstanceRepairAbandoned,
    TaskFailed,
)
from skulk.shared.types.ids import DownloadAttemptId, EventId, InstanceId, ModelId, NodeId
from skulk.shared.types.instances import MAX_REPAIR_HOP, Instance
from skulk.shared.types.state import DownloadStatusFailed, State
from skulk.shared.types.stream_errors import StreamErrorType
from skulk.shared.types.telemetry import NodeResources

CREDIT_GRACE_S = 15.0
"""How long a deleted instance's memory is credited back to placement: three rounds of the
5 s NodeResources reading, after which the gossiped figure reflects the teardown and a
genuine shortfall reasserts itself."""

MEMORY_HOLDING_RUNNER_STATES = frozenset({"Loading", "Loaded", "WarmingUp", "Ready", "Running", "ShuttingDown"})
"""Runner states in which a shard's weights may be resident. Only these are credited back:
a refused or never-started rank holds nothing, and crediting it would hand the refusing
node memory it does not have."""

PLACEMENT_REFUSED = StreamErrorType.PLACEMENT_REFUSED
DOWNLOAD_FAILED = StreamErrorType.DOWNLOAD_FAILED
GROUP_BROKEN = StreamErrorType.GROUP_BROKEN
RUNNER_CRASHED = StreamErrorType.RUNNER_CRASHED
"""`error_type` of the TaskFailed events a repair emits."""


NewId = Callable[[], str]


@dataclass(frozen=True)
class RepairInputs:
    """What a re-placement reads besides State."""

    new_id: NewId
    cards: Mapping[ModelId, ModelCard] = field(default_factory=dict[ModelId, ModelCard])
    resources: Mapping[NodeId, NodeResources] = field(default_factory=dict[NodeId, NodeResources])
    memory_credits: Mapping[NodeId, int] = field(default_factory=dict[NodeId, int])


# -- memory credit --------------------------------------------------------------------------


def held_footprints(state: State, instance: Instance, card: ModelCard | None) -> dict[NodeId, int]:
    """Admission bytes per node of the instance's shards whose runner may hold memory."""
    if card is None:
        return {}
    held: dict[NodeId, int] = {}
    for shard in instance.shards:
        status = state.runners.get(shard.runner_id)
        if status is not None and status.state in MEMORY_HOLDING_RUNNER_STATES:
            held[shard.node_id] = held.get(shard.node_id, 0) + assignment_footprint(card, shard).total_bytes
    return held


def merge_credits(*credits: Mapping[NodeId, int]) -> dict[NodeId, int]:
    merged: dict[NodeId, int] = {}
    for credit in credits:
        for node_id, size in credit.items():
            merged[node_id] = merged.get(node_id, 0) + size
    return merged


@dataclass(frozen=True)
class DeletionCredit:
    """Memory a deleted instance held, per node, and when the shell saw it deleted."""

    node_bytes: Mapping[NodeId, int]
    deleted_at: float


def record_deletion(
    credits: Sequence[DeletionCredit], state_before: State, instance_id: InstanceId,
    cards: Mapping[ModelId, ModelCard], now: float,
) -> tuple[DeletionCredit, ...]:
    """`credits` without expired entries, plus one for `instance_id` (read from the State
    before its InstanceDeleted applies) when it held any memory."""
    kept = tuple(c for c in credits if now - c.deleted_at < CREDIT_GRACE_S)
    instance = state_before.instances.get(instance_id)
    held = held_footprints(state_before, instance, cards.get(instance.model_id)) if instance else {}
    return (*kept, DeletionCredit(held, now)) if held else kept


def active_credits(credits: Iterable[DeletionCredit], now: float) -> dict[NodeId, int]:
    """Bytes per node still credited at `now`."""
    return merge_credits(*(c.node_bytes for c in credits if now - c.deleted_at < CREDIT_GRACE_S))


# -- teardown ---------------------------------------------------------------------------------


def teardown(state: State, instance: Instance, error_type: StreamErrorType, message: str, new_id: NewId) -> list[Event]:
    """TaskFailed for every open task of the instance (State's task order), then its
    InstanceDeleted: the owning API fails each stream before the instance disappears."""
    failed: list[Event] = [
        TaskFailed(
            event_id=EventId(new_id()), task_id=task.task_id, error_type=error_type,
            error_message=f"{message}; instance {instance.instance_id} is being torn down",
        )
        for task in state.tasks.values()
        if task.instance_id == instance.instance_id and task.status not in TERMINAL_TASK_STATUSES
    ]
    return [*failed, InstanceDeleted(event_id=EventId(new_id()), instance_id=instance.instance_id, reason=message)]


def _width(instance: Instance) -> int:
    return len(set(instance.node_ids()))


def _replace(
    instance: Instance, state: State, inputs: RepairInputs, credits: Mapping[NodeId, int],
    attempts: Sequence[tuple[int, PlacementRequest]],
) -> Instance | list[str]:
    """The first attempt that places, stamped with its repair hop; else why each failed."""
    card = inputs.cards.get(instance.model_id)
    if card is None:
        return [f"no model card for {instance.model_id}"]
    errors: list[str] = []
    for hop, request in attempts:
        # The operator's slot choice and the KV cache type the instance was admitted with hold.
        request = replace(request, slots=instance.requested_slots, kv_cache_type=instance.shards[0].kv_cache_type)
        try:
            placed = place(card, state, inputs.resources, request, new_id=inputs.new_id, memory_credits=credits)
        except PlacementError as exc:
            nodes = request.min_nodes if request.max_nodes == request.min_nodes else f"{request.min_nodes}+"
            errors.append(f"hop {hop}, {nodes} node(s): {exc}")
            continue
        # A repaired instance keeps its placement's residency (idleTtl).
        return placed.model_copy(update={"repair_hop": hop, "idle_ttl_s": instance.idle_ttl_s})
    return errors


def _abandoned(instance: Instance, node_id: NodeId | None, hop: int, reason: str, new_id: NewId) -> InstanceRepairAbandoned:
    return InstanceRepairAbandoned(
        event_id=EventId(new_id()), model_id=instance.model_id, instance_id=instance.instance_id,
        node_id=node_id, repair_hop=hop, reason=reason,
    )


# -- a refused shard ----------------------------------------------------------------------------


def refusal_attempts(instance: Instance, refuser: NodeId) -> list[tuple[int, PlacementRequest]]:
    """The re-placements a refusal of `instance` may try, in order, as (hop, request):
    one node wider from hop 0, then a single node without the refuser; none at the last hop."""
    excluded = frozenset(instance.excluded_nodes)
    attempts: list[tuple[int, PlacementRequest]] = []
    if instance.repair_hop >= MAX_REPAIR_HOP:
        return attempts
    if instance.repair_hop == 0:
        attempts.append((1, PlacementRequest(
            model_id=instance.model_id, sharding=instance.sharding, min_nodes=_width(instance) + 1,
            excluded_nodes=excluded,
        )))
    attempts.append((MAX_REPAIR_HOP, PlacementRequest(
        # One rank: pipeline and tensor are the same placement, and pipeline needs no card support.
        model_id=instance.model_id, sharding="Pipeline", min_nodes=1, max_nodes=1,
        excluded_nodes=excluded | {refuser},
    )))
    return attempts


def repair_refused(state: State, instance: Instance, command: RefuseInstancePlacement, inputs: RepairInputs) -> list[Event]:
    """Refusal recorded, requests failed, instance deleted, then the next hop's placement or
    InstanceRepairAbandoned. The caller has checked that the instance exists and that the
    refuser hosts it."""
    new_id = inputs.new_id
    reason = f"node {command.node_id} refused its shard of {instance.model_id}: {command.message}"
    events: list[Event] = [
        InstancePlacementRefused(
            event_id=EventId(new_id()), instance_id=instance.instance_id, node_id=command.node_id,
            needed_bytes=command.needed_bytes, available_bytes=command.available_bytes, message=command.message,
        ),
        *teardown(state, instance, PLACEMENT_REFUSED, reason, new_id),
    ]
    attempts = refusal_attempts(instance, command.node_id)
    if not attempts:
        events.append(_abandoned(
            instance, command.node_id, instance.repair_hop,
            f"{reason}; refused at repair hop {instance.repair_hop}, the last: giving up", new_id,
        ))
        return events
    held = held_footprints(state, instance, inputs.cards.get(instance.model_id))
    held.pop(command.node_id, None)  # the refuser never loaded its shard
    outcome = _replace(instance, state, inputs, merge_credits(inputs.memory_credits, held), attempts)
    if isinstance(outcome, Instance):
        excluded = sorted({*outcome.excluded_nodes, *instance.excluded_nodes})
        events.append(InstanceCreated(event_id=EventId(new_id()), instance=outcome.model_copy(update={"excluded_nodes": excluded})))
    else:
        events.append(_abandoned(
            instance, command.node_id, instance.repair_hop,
            f"{reason}; no re-placement: {'; '.join(outcome)}", new_id,
        ))
    return events


# -- a failed download --------------------------------------------------------------------------


def failed_downloads(state: State, instance: Instance) -> dict[NodeId, str]:
    """Hosting nodes whose download of the instance's model failed terminally, with why."""
    failed: dict[NodeId, str] = {}
    for node_id in sorted(set(instance.node_ids())):
        status = state.downloads.get(node_id, {}).get(instance.model_id)
        if isinstance(status, DownloadStatusFailed):
            failed[node_id] = status.error_message
    return failed


def repair_failed_download(state: State, inputs: RepairInputs) -> list[Event] | None:
    """For the first instance (id order) that is not serving and has a rank whose download
    failed: fail its requests with the download error, delete it, reset the failed records
    to pending, and re-place it at the same width without the failed node(s). None when no
    instance needs it."""
    new_id = inputs.new_id
    for _, instance in sorted(state.instances.items()):
        if serving(state, instance):
            continue
        failed = failed_downloads(state, instance)
        if not failed:
            continue
        reason = "; ".join(f"download of {instance.model_id} on node {n} failed: {why}" for n, why in failed.items())
        events: list[Event] = teardown(state, instance, DOWNLOAD_FAILED, reason, new_id)
        events += [
            DownloadPending(event_id=EventId(new_id()), node_id=node_id, model_id=ModelId(instance.model_id),
                            attempt_id=DownloadAttemptId(new_id()))
            for node_id in failed
        ]
        width = _width(instance)
        request = PlacementRequest(
            model_id=instance.model_id, sharding=instance.sharding, min_nodes=width, max_nodes=width,
            excluded_nodes=frozenset(instance.excluded_nodes) | frozenset(failed),
        )
        held = held_footprints(state, instance, inputs.cards.get(instance.model_id))
        outcome = _replace(instance, state, inputs, merge_credits(inputs.memory_credits, held),
                           [(instance.repair_hop, request)])
        if isinstance(outcome, Instance):
            events.append(InstanceCreated(event_id=EventId(new_id()), instance=outcome))
        else:
            blamed = next(iter(failed)) if len(failed) == 1 else None
            events.append(_abandoned(instance, blamed, instance.repair_hop,
                                     f"{reason}; no healthy placement: {'; '.join(outcome)}", new_id))
        return events
    return None


# -- a group that broke after serving --------------------------------------------------------------


def broken_group_failures(state: State, instance: Instance) -> list[tuple[int, NodeId, str]]:
    """(rank, node, error) of each runner of a multi-rank instance that failed after serving
    (its Failed status says `served`); empty when none did."""
    if len(instance.shards) < 2:
        return []
    out: list[tuple[int, NodeId, str]] = []
    for shard in sorted(instance.shards, key=lambda s: s.rank):
        status = state.runners.get(shard.runner_id)
        if status is not None and status.state == "Failed" and status.served:
            out.append((shard.rank, shard.node_id, status.error_message or "no reason given"))
    return out


def repair_broken_group(state: State, due: frozenset[InstanceId], inputs: RepairInputs) -> list[Event] | None:
    """For the first instance of `due` (id order) that has a rank that failed after serving
    (`broken_group_failures`: its runner crashed or was killed while its node stays up):
    fail its requests naming the rank and node, delete it, and place it again at the same
    width with a fresh instance id, hence fresh ring ports. A lone rank can never rejoin a
    formed group, so the worker does not restart it; only a new group can serve. Each such
    repair is one more repair hop: past MAX_REPAIR_HOP, InstanceRepairAbandoned, so a group
    that keeps breaking is given up instead of re-placed forever. Only ranks that had served
    count: a rank that fails before its group ever formed (a refusal, a failed download) is
    the other repairs' business. None when no instance needs it."""
    new_id = inputs.new_id
    for instance_id, instance in sorted(state.instances.items()):
        if instance_id not in due:
            continue
        failures = broken_group_failures(state, instance)
        if not failures:
            continue
        reason = "; ".join(f"rank {rank} on node {node} failed: {why}" for rank, node, why in failures)
        events: list[Event] = teardown(state, instance, GROUP_BROKEN, reason, new_id)
        hop = instance.repair_hop + 1
        blamed = failures[0][1] if len({n for _r, n, _w in failures}) == 1 else None
        if hop > MAX_REPAIR_HOP:
            events.append(_abandoned(instance, blamed, instance.repair_hop,
                                     f"{reason}; the group broke at repair hop {instance.repair_hop}, the last: giving up",
                                     new_id))
            return events
        width = _width(instance)
        request = PlacementRequest(model_id=instance.model_id, sharding=instance.sharding, min_nodes=width,
                                   max_nodes=width, excluded_nodes=frozenset(instance.excluded_nodes))
        held = held_footprints(state, instance, inputs.cards.get(instance.model_id))
        outcome = _replace(instance, state, inputs, merge_credits(inputs.memory_credits, held), [(hop, request)])
        if isinstance(outcome, Instance):
            events.append(InstanceCreated(event_id=EventId(new_id()), instance=outcome))
        else:
            events.append(_abandoned(instance, blamed, instance.repair_hop,
                                     f"{reason}; no re-placement: {'; '.join(outcome)}", new_id))
        return events
    return None


# -- a runner its worker gave up on ------------------------------------------------------------------


def given_up_runners(state: State, instance: Instance) -> list[tuple[int, NodeId, str]]:
    """(rank, node, reason) of each runner of `instance` whose worker gave up on it (a Failed
    status with `gave_up`: its crash breaker tripped), in rank order. A rank of a multi-rank
    group that failed after serving is left out: that is a broken group
    (`repair_broken_group`, after its grace), not a runner that keeps failing."""
    broken = {rank for rank, _n, _w in broken_group_failures(state, instance)}
    out: list[tuple[int, NodeId, str]] = []
    for shard in sorted(instance.shards, key=lambda s: s.rank):
        status = state.runners.get(shard.runner_id)
        if status is not None and status.state == "Failed" and status.gave_up and shard.rank not in broken:
            out.append((shard.rank, shard.node_id, status.error_message or "no reason given"))
    return out


def already_abandoned(state: State, instance: Instance) -> bool:
    """The master already gave up repairing this very instance (it is kept, Failed, with the
    reason in `State.repair_failures`): deciding again would repeat the same events forever."""
    failure = state.repair_failures.get(instance.model_id)
    return failure is not None and failure.instance_id == instance.instance_id


def repair_given_up(state: State, inputs: RepairInputs) -> list[Event] | None:
    """For the first instance (id order) with a runner its worker gave up on
    (`given_up_runners`), not already abandoned: place it again away from the failing
    node(s), its width first, then narrower down to one node, the operator's exclusions kept
    and the failing node(s) added to them, so the new instance never returns there until an
    operator places the model again. One repair hop further each time: a model that keeps
    failing wherever it goes stops at MAX_REPAIR_HOP. When it is placed, the old instance's
    open requests fail (RunnerCrashed, naming the rank and node), then it is deleted, then
    the new one is created.

    When nothing else admits it (or past the last hop), the instance is *kept*, Failed: the
    API refuses its requests at once with the typed 503 `model_not_serving` naming the
    runner's state and reason, and InstanceRepairAbandoned records why in
    `State.repair_failures` (which also stops this rule from deciding again). Tearing it down
    instead would turn a clear refusal into "model not placed". None when no instance needs
    it.

    Bounded: a worker gives up only after its crash breaker's crashes, each repair adds a
    hop, and an abandoned instance is never reconsidered, so there is no repair storm."""
    new_id = inputs.new_id
    for _, instance in sorted(state.instances.items()):
        failures = given_up_runners(state, instance)
        if not failures or already_abandoned(state, instance):
            continue
        failing = sorted({node for _rank, node, _why in failures})
        reason = "; ".join(f"rank {rank} on node {node} keeps failing: {why}" for rank, node, why in failures)
        blamed = failing[0] if len(failing) == 1 else None
        hop = instance.repair_hop + 1
        if hop > MAX_REPAIR_HOP:
            return [_abandoned(instance, blamed, instance.repair_hop,
                               f"{reason}; repair hop {instance.repair_hop} was the last: the instance stays Failed "
                               f"until an operator places {instance.model_id} again", new_id)]
        attempts = [(hop, request) for _h, request in node_loss_attempts(instance, failing)]
        held = {n: b for n, b in held_footprints(state, instance, inputs.cards.get(instance.model_id)).items()
                if n not in failing}
        outcome = _replace(instance, state, inputs, merge_credits(inputs.memory_credits, held), attempts)
        if not isinstance(outcome, Instance):
            return [_abandoned(instance, blamed, instance.repair_hop,
                               f"{reason}; no other node admits {instance.model_id} ({'; '.join(outcome)}): "
                               f"the instance stays Failed until an operator places it again", new_id)]
        excluded = sorted({*instance.excluded_nodes, *failing})
        return [
            *teardown(state, instance, RUNNER_CRASHED, reason, new_id),
            InstanceCreated(event_id=EventId(new_id()), instance=outcome.model_copy(update={"excluded_nodes": excluded})),
        ]
    return None


# -- a lost node ----------------------------------------------------------------------------------


def node_loss_attempts(instance: Instance, lost: Iterable[NodeId]) -> list[tuple[int, PlacementRequest]]:
    """The re-placements after `instance` lost `lost`, in order, as (hop, request): its
    width, then each narrower width down to one node, same sharding (one rank is always a
    pipeline placement), the operator's exclusions plus the lost nodes."""
    excluded = frozenset(instance.excluded_nodes) | frozenset(lost)
    return [
        (instance.repair_hop, PlacementRequest(
            model_id=instance.model_id, sharding=instance.sharding if width > 1 else "Pipeline",
            min_nodes=width, max_nodes=width, excluded_nodes=excluded,
        ))
        for width in range(_width(instance), 0, -1)
    ]


def _debit(resources: Mapping[NodeId, NodeResources], placed: Instance, card: ModelCard) -> dict[NodeId, NodeResources]:
    """`resources` less the admission bytes of `placed`'s shards: a later re-placement in the
    same pass must not count on memory an earlier one just took (telemetry has not seen it)."""
    out = dict(resources)
    for shard in placed.shards:
        reading = out.get(shard.node_id)
        if reading is None:
            continue
        left = max(reading.memory.ram_available_bytes - assignment_footprint(card, shard).total_bytes, 0)
        out[shard.node_id] = reading.model_copy(
            update={"memory": reading.memory.model_copy(update={"ram_available_bytes": left})}
        )
    return out


def replace_after_node_loss(
    state: State, torn_down: Sequence[tuple[Instance, str]], lost: Iterable[NodeId], inputs: RepairInputs,
) -> list[Event]:
    """One InstanceCreated (on survivors) or InstanceRepairAbandoned per instance the caller
    tore down because `lost` went away, in the given order; `torn_down` pairs each instance
    with the teardown's reason. `state` is the State the teardown was planned on (the lost
    nodes may still be members there: they are excluded explicitly). The memory the torn-down
    shards held on survivors is credited back."""
    lost = frozenset(lost)
    events: list[Event] = []
    resources = inputs.resources
    for instance, reason in torn_down:
        card = inputs.cards.get(instance.model_id)
        held = {n: b for n, b in held_footprints(state, instance, card).items() if n not in lost}
        outcome = _replace(
            instance, state, RepairInputs(inputs.new_id, inputs.cards, resources, inputs.memory_credits),
            merge_credits(inputs.memory_credits, held), node_loss_attempts(instance, lost),
        )
        if isinstance(outcome, Instance):
            assert card is not None  # _replace places only with a card
            resources = _debit(resources, outcome, card)
            kept = outcome.model_copy(update={"excluded_nodes": sorted(instance.excluded_nodes)})
            events.append(InstanceCreated(event_id=EventId(inputs.new_id()), instance=kept))
        else:
            mine = sorted(lost & set(instance.node_ids()))
            blamed = mine[0] if len(mine) == 1 else None  # the one node this instance lost
            events.append(_abandoned(instance, blamed, instance.repair_hop,
                                     f"{reason}; no placement on the survivors: {'; '.join(outcome)}", inputs.new_id))
    return events


__all__ = [
    "CREDIT_GRACE_S",
    "DOWNLOAD_FAILED",
    "GROUP_BROKEN",
    "MEMORY_HOLDING_RUNNER_STATES",
    "PLACEMENT_REFUSED",
    "RUNNER_CRASHED",
    "DeletionCredit",
    "RepairInputs",
    "active_credits",
    "already_abandoned",
    "broken_group_failures",
    "failed_downloads",
    "given_up_runners",
    "held_footprints",
    "merge_credits",
    "node_loss_attempts",
    "record_deletion",
    "refusal_attempts",
    "repair_broken_group",
    "repair_failed_download",
    "repair_given_up",
    "repair_refused",
    "replace_after_node_loss",
    "teardown",
]
