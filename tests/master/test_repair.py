"""Self-healing placements: refusal hops, download-failure repair and the memory credit, as
tables over hand-built State (no processes, no clock)."""

import itertools
from datetime import UTC, datetime

import pytest

from skulk.master.commands import DecisionContext, Refusal, decide
from skulk.master.plan import MasterView, plan
from skulk.master.repair import (
    CREDIT_GRACE_S,
    DeletionCredit,
    active_credits,
    held_footprints,
    record_deletion,
    refusal_attempts,
)
from skulk.models.cards import builtin_cards_dir, resolve_cards
from skulk.shared.apply import apply_all
from skulk.shared.memory_estimate import assignment_footprint
from skulk.shared.types.commands import RefuseInstancePlacement
from skulk.shared.types.common import ChatMessage, Edge
from skulk.shared.types.events import (
    DownloadPending,
    IndexedEvent,
    InstanceCreated,
    InstanceDeleted,
    InstancePlacementRefused,
    InstanceRepairAbandoned,
    TaskFailed,
)
from skulk.shared.types.instances import MAX_REPAIR_HOP, Instance, RunnerStatus, ShardAssignment
from skulk.shared.types.state import DownloadStatusFailed, DownloadStatusPending, NodeInfo, State
from skulk.shared.types.tasks import TextGeneration, TextGenerationParams
from skulk.shared.types.telemetry import DiskReading, MemoryReading, NodeResources

CARDS = resolve_cards(builtin_cards_dir(), None).cards
MLX = CARDS["mlx-community/Llama-3.2-1B-Instruct-4bit"]  # 16 layers, ~1.6 GB whole
GGUF = CARDS["Qwen/Qwen2.5-0.5B-Instruct-GGUF"]  # llama.cpp: a single-node engine
GB = 10**9
MLX_CPU = ("mlx", "mlx-cpu")
LLAMA_CPU = ("llama_cpp", "llama_cpp-cpu")


def res(node, available, backends=MLX_CPU):
    return NodeResources(
        node_id=node, node_name=node, version="0",
        memory=MemoryReading(ram_total_bytes=available * 2, ram_available_bytes=available),
        disk=DiskReading(models_dir="/m", total_bytes=10**12, free_bytes=10**12),
        backends=list(backends),
    )


def members(*nodes):
    """Members fully linked (every pair shares an edge)."""
    edges = [Edge(source=a, sink=b, kind="session") for a, b in itertools.combinations(nodes, 2)]
    return {n: NodeInfo(node_id=n, node_name=n, version="0") for n in nodes}, edges


def shard(node, rank, world, start, end, backend="mlx-cpu"):
    return ShardAssignment(node_id=node, runner_id=f"r-{node}-{rank}", rank=rank, world_size=world,
                           start_layer=start, end_layer=end, backend=backend)


def instance_on(card, nodes, *, hop=0, excluded=(), instance_id="i1", backend="mlx-cpu"):
    n = len(nodes)
    bounds = [card.num_layers * i // n for i in range(n + 1)]
    return Instance(
        instance_id=instance_id, model_id=card.model_id, sharding="Pipeline",
        shards=[shard(node, r, n, bounds[r], bounds[r + 1], backend) for r, node in enumerate(nodes)],
        context_token_limit=2048, repair_hop=hop, excluded_nodes=sorted(excluded),
    )


def task_on(instance, task_id="t1", status="Running"):
    params = TextGenerationParams(model_id=instance.model_id, messages=[ChatMessage(role="user", content="hi")])
    return TextGeneration(task_id=task_id, instance_id=instance.instance_id, command_id=f"c-{task_id}",
                          owner_node_id="api", params=params, status=status)


def state_with(instance, nodes, *, runners=None, tasks=(), downloads=None):
    node_infos, edges = members(*nodes)
    return State(
        nodes=node_infos, edges=edges, instances={instance.instance_id: instance},
        runners=runners or {}, tasks={t.task_id: t for t in tasks}, downloads=downloads or {},
    )


def ctx(resources, *, origin, credits=None):
    counter = itertools.count()
    return DecisionContext(new_id=lambda: f"id{next(counter)}", origin=origin, cards=CARDS,
                           resources=resources, memory_credits=credits or {})


def refuse(instance, node):
    return RefuseInstancePlacement(command_id="cr", instance_id=instance.instance_id, node_id=node,
                                   needed_bytes=2 * GB, available_bytes=GB, message="needs 2.00 GB, 1.00 GB free")


def kinds(decision):
    return decision.code if isinstance(decision, Refusal) else [type(e).__name__ for e in decision]


def created(events):
    found = [e.instance for e in events if isinstance(e, InstanceCreated)]
    return found[0] if found else None


# -- refusal: the hop table ------------------------------------------------------------------------

ABC = ("a", "b", "c")
ROOMY = {n: res(n, 8 * GB) for n in ABC}
SMALL_SHARES_ONLY = {n: res(n, int(1.3 * GB)) for n in ABC}  # 1.6 GB whole fits nowhere; halves fit
GGUF_NODES = {n: res(n, 8 * GB, LLAMA_CPU) for n in ABC}


@pytest.mark.parametrize(
    ("name", "inst", "refuser", "resources", "expected_kinds", "expected_nodes", "expected_hop"),
    [
        ("hop 0 refused: one node wider",
         instance_on(MLX, ["a"]), "a", ROOMY,
         ["InstancePlacementRefused", "TaskFailed", "InstanceDeleted", "InstanceCreated"], 2, 1),
        ("hop 0 two-node refused: three nodes",
         instance_on(MLX, ["a", "b"]), "b", SMALL_SHARES_ONLY,
         ["InstancePlacementRefused", "TaskFailed", "InstanceDeleted", "InstanceCreated"], 3, 1),
        ("hop 0 on a GGUF model: one node wider is a llama.cpp pool",
         instance_on(GGUF, ["a"], backend="llama_cpp-cpu"), "a", GGUF_NODES,
         ["InstancePlacementRefused", "TaskFailed", "InstanceDeleted", "InstanceCreated"], 2, 1),
        ("hop 1 refused: single node without the refuser",
         instance_on(MLX, ["a", "b"], hop=1), "a", ROOMY,
         ["InstancePlacementRefused", "TaskFailed", "InstanceDeleted", "InstanceCreated"], 1, 2),
        ("hop 2 refused: terminal, nothing placed",
         instance_on(MLX, ["b"], hop=2), "b", ROOMY,
         ["InstancePlacementRefused", "TaskFailed", "InstanceDeleted", "InstanceRepairAbandoned"], None, None),
        ("hop 1 refused and no single node fits: abandoned",
         instance_on(MLX, ["a", "b"], hop=1), "a", SMALL_SHARES_ONLY,
         ["InstancePlacementRefused", "TaskFailed", "InstanceDeleted", "InstanceRepairAbandoned"], None, None),
    ],
)
def test_refusal_hops(name, inst, refuser, resources, expected_kinds, expected_nodes, expected_hop):
    state = state_with(inst, ABC, tasks=[task_on(inst)])
    events = decide(state, refuse(inst, refuser), ctx(resources, origin=refuser))
    assert kinds(events) == expected_kinds
    placed = created(events)
    if expected_nodes is None:
        assert placed is None
        abandoned = events[-1]
        assert isinstance(abandoned, InstanceRepairAbandoned)
        assert (abandoned.model_id, abandoned.node_id, abandoned.repair_hop) == (inst.model_id, refuser, inst.repair_hop)
        assert refuser in abandoned.reason
    else:
        assert len(placed.node_ids()) == expected_nodes and placed.repair_hop == expected_hop
        assert placed.instance_id != inst.instance_id
        if expected_hop == MAX_REPAIR_HOP:
            assert refuser not in placed.node_ids() and refuser in placed.excluded_nodes


def test_refusal_fails_open_requests_with_the_reason_before_the_delete():
    inst = instance_on(MLX, ["a"])
    done = task_on(inst, "t2", status="Complete")
    state = state_with(inst, ABC, tasks=[task_on(inst), done])
    events = decide(state, refuse(inst, "a"), ctx(ROOMY, origin="a"))
    failed = [e for e in events if isinstance(e, TaskFailed)]
    assert [e.task_id for e in failed] == ["t1"]  # the finished task is left alone
    assert failed[0].error_type == "PlacementRefused" and "node a refused" in failed[0].error_message
    assert "1.00 GB free" in failed[0].error_message
    order = [type(e) for e in events]
    assert order.index(TaskFailed) < order.index(InstanceDeleted) < order.index(InstanceCreated)
    assert isinstance(events[0], InstancePlacementRefused) and events[0].node_id == "a"


@pytest.mark.parametrize(
    ("name", "inst", "refuser", "resources"),
    [
        ("wider", instance_on(MLX, ["a"], excluded=["c"]), "a", {**ROOMY, "d": res("d", 8 * GB)}),
        ("single-node fallback", instance_on(MLX, ["a", "b"], hop=1, excluded=["c"]), "a", {**ROOMY, "d": res("d", 8 * GB)}),
    ],
)
def test_operator_exclusions_survive_every_repair(name, inst, refuser, resources):
    state = state_with(inst, ("a", "b", "c", "d"))
    placed = created(decide(state, refuse(inst, refuser), ctx(resources, origin=refuser)))
    assert "c" not in placed.node_ids()
    assert "c" in placed.excluded_nodes


@pytest.mark.parametrize(
    ("name", "state", "command", "origin", "code"),
    [
        ("unknown instance (a duplicate refusal)", State(), refuse(instance_on(MLX, ["a"]), "a"), "a", "unknown_instance"),
        ("a node refusing for another", state_with(instance_on(MLX, ["a"]), ABC), refuse(instance_on(MLX, ["a"]), "a"), "b",
         "not_the_refuser"),
        ("a node that hosts no shard", state_with(instance_on(MLX, ["a"]), ABC), refuse(instance_on(MLX, ["a"]), "b"), "b",
         "not_a_host"),
    ],
)
def test_refusals_that_are_refused(name, state, command, origin, code):
    assert kinds(decide(state, command, ctx(ROOMY, origin=origin))) == code


@pytest.mark.parametrize(
    ("hop", "expected"),
    [(0, [(1, 3, None, frozenset({"x"})), (2, 1, 1, frozenset({"x", "a"}))]),
     (1, [(2, 1, 1, frozenset({"x", "a"}))]),
     (2, [])],
)
def test_refusal_attempts_by_hop(hop, expected):
    inst = instance_on(MLX, ["a", "b"], hop=hop, excluded=["x"])
    got = [(h, r.min_nodes, r.max_nodes, r.excluded_nodes) for h, r in refusal_attempts(inst, "a")]
    assert got == expected


def _indexed(events, start):
    at = datetime(2026, 1, 1, tzinfo=UTC)
    return [IndexedEvent(idx=start + i, origin="m", indexed_at=at, event=e) for i, e in enumerate(events)]


@pytest.mark.parametrize("resources", [ROOMY, SMALL_SHARES_ONLY, GGUF_NODES])
def test_a_node_that_always_refuses_ends_the_chain_within_two_hops(resources):
    """Every hosting node refuses everything: at most MAX_REPAIR_HOP re-placements, then a
    terminal failure recorded in State. Never oscillates."""
    card = GGUF if resources is GGUF_NODES else MLX
    backend = "llama_cpp-cpu" if resources is GGUF_NODES else "mlx-cpu"
    state = state_with(instance_on(card, ["a"], backend=backend), ABC)
    state = state.model_copy(update={"last_event_applied_idx": 0})
    placements = 0
    for _ in range(10):
        if not state.instances:
            break
        (inst,) = state.instances.values()
        refuser = inst.node_ids()[0]
        events = decide(state, refuse(inst, refuser), ctx(resources, origin=refuser))
        placements += created(events) is not None
        state = apply_all(state, _indexed(events, state.last_event_applied_idx + 1))
    assert not state.instances
    assert placements <= MAX_REPAIR_HOP
    failure = state.repair_failures[card.model_id]
    assert failure.repair_hop <= MAX_REPAIR_HOP and failure.node_id is not None


# -- memory credit -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "runner_state", "expected_kinds"),
    [
        ("b's shard loaded: its memory is credited, the wider set fits",
         "Ready", ["InstancePlacementRefused", "InstanceDeleted", "InstanceCreated"]),
        ("b's shard never loaded: no credit, nothing fits",
         "Failed", ["InstancePlacementRefused", "InstanceDeleted", "InstanceRepairAbandoned"]),
    ],
)
def test_the_torn_down_instance_is_credited_back(name, runner_state, expected_kinds):
    inst = instance_on(MLX, ["a", "b"])
    b_shard = inst.shards[1]
    # b's gossiped memory still counts its loaded shard as used; c alone cannot hold the model.
    resources = {"a": res("a", int(1.3 * GB)), "b": res("b", 300_000_000), "c": res("c", int(0.9 * GB))}
    state = state_with(inst, ABC, runners={b_shard.runner_id: RunnerStatus(state=runner_state)})
    events = decide(state, refuse(inst, "a"), ctx(resources, origin="a"))
    assert kinds(events) == expected_kinds


@pytest.mark.parametrize(
    ("name", "runners", "expected"),
    [
        ("nothing loaded", {}, set()),
        ("one rank loading", {"r-b-1": RunnerStatus(state="Loading")}, {"b"}),
        ("failed rank holds nothing", {"r-a-0": RunnerStatus(state="Failed"), "r-b-1": RunnerStatus(state="Ready")}, {"b"}),
    ],
)
def test_held_footprints(name, runners, expected):
    inst = instance_on(MLX, ["a", "b"])
    state = state_with(inst, ABC, runners=runners)
    held = held_footprints(state, inst, MLX)
    assert set(held) == expected
    for node in expected:
        shard_of = next(s for s in inst.shards if s.node_id == node)
        assert held[node] == assignment_footprint(MLX, shard_of).total_bytes


def test_deletion_credit_expires_after_the_grace_window():
    inst = instance_on(MLX, ["a"])
    state = state_with(inst, ABC, runners={"r-a-0": RunnerStatus(state="Ready")})
    credits = record_deletion((), state, inst.instance_id, CARDS, now=100.0)
    footprint = assignment_footprint(MLX, inst.shards[0]).total_bytes
    assert active_credits(credits, 100.0) == {"a": footprint}
    assert active_credits(credits, 100.0 + CREDIT_GRACE_S - 0.1) == {"a": footprint}
    assert active_credits(credits, 100.0 + CREDIT_GRACE_S) == {}
    # Recording a later deletion drops expired entries; an instance that held nothing adds none.
    later = record_deletion(credits, state_with(inst, ABC), inst.instance_id, CARDS, now=200.0)
    assert later == ()
    two = record_deletion((DeletionCredit({"b": 5}, 99.0),), state, inst.instance_id, CARDS, now=100.0)
    assert active_credits(two, 100.0) == {"a": footprint, "b": 5}


# -- download failure ---------------------------------------------------------------------------------


def failed_on(node, model_id, message="disk full"):
    return {node: {model_id: DownloadStatusFailed(attempt_id="a1", error_message=message)}}


def master_view(state, resources):
    return MasterView(state=state, me="m", cards=CARDS, resources=resources)


def ids():
    counter = itertools.count()
    return lambda: f"id{next(counter)}"


GGUF_INST = instance_on(GGUF, ["a"], backend="llama_cpp-cpu")


@pytest.mark.parametrize(
    ("name", "state", "resources", "expected"),
    [
        ("loading instance, its rank's download failed: teardown, reset, re-place elsewhere",
         state_with(GGUF_INST, ABC, tasks=[task_on(GGUF_INST)], downloads=failed_on("a", GGUF.model_id)), GGUF_NODES,
         ["TaskFailed", "InstanceDeleted", "DownloadPending", "InstanceCreated"]),
        ("no healthy node left: stop at the teardown",
         state_with(GGUF_INST, ("a",), downloads=failed_on("a", GGUF.model_id)), {"a": GGUF_NODES["a"]},
         ["InstanceDeleted", "DownloadPending", "InstanceRepairAbandoned"]),
        ("serving instance: a stale failure is not a reason to tear it down",
         state_with(GGUF_INST, ABC, runners={"r-a-0": RunnerStatus(state="Ready")},
                    downloads=failed_on("a", GGUF.model_id)), GGUF_NODES, []),
        ("failure of another model on the node: nothing to do",
         state_with(GGUF_INST, ABC, downloads=failed_on("a", "other/model")), GGUF_NODES, []),
        ("failure on a node the instance does not use: nothing to do",
         state_with(GGUF_INST, ABC, downloads=failed_on("b", GGUF.model_id)), GGUF_NODES, []),
    ],
)
def test_download_failure_repair(name, state, resources, expected):
    assert [type(e).__name__ for e in plan(master_view(state, resources), ids())] == expected


def test_download_repair_keeps_width_and_exclusions_and_reports_the_error():
    inst = instance_on(MLX, ["a", "b"], excluded=["d"])
    nodes = ("a", "b", "c", "d")
    resources = {n: res(n, int(1.3 * GB)) for n in nodes}
    state = state_with(inst, nodes, tasks=[task_on(inst)], downloads=failed_on("b", MLX.model_id, "hub 500"))
    events = plan(master_view(state, resources), ids())
    failed = next(e for e in events if isinstance(e, TaskFailed))
    assert failed.error_type == "DownloadFailed" and "hub 500" in failed.error_message and "node b" in failed.error_message
    reset = next(e for e in events if isinstance(e, DownloadPending))
    assert (reset.node_id, reset.model_id) == ("b", MLX.model_id)
    placed = created(events)
    assert len(placed.node_ids()) == 2 and "b" not in placed.node_ids() and "d" not in placed.node_ids()
    assert set(placed.excluded_nodes) == {"b", "d"}
    after = apply_all(state.model_copy(update={"last_event_applied_idx": -1}), _indexed(events, 0))
    assert isinstance(after.downloads["b"][MLX.model_id], DownloadStatusPending)
    assert plan(master_view(after, resources), ids()) == []  # repaired once, not again


def test_a_departed_node_is_handled_before_a_failed_download():
    state = state_with(GGUF_INST, ("b",), downloads={})  # a is no longer a member
    state = state.model_copy(update={"downloads": failed_on("b", GGUF.model_id)})
    events = plan(master_view(state, GGUF_NODES), ids())
    # the loss is handled (and the model placed again on the survivor) before the download
    assert [type(e).__name__ for e in events] == ["InstanceDeleted", "InstanceCreated"]
    assert "no longer a cluster member" in events[0].reason
    assert created(events).node_ids() == ["b"]


def test_a_request_after_an_abandoned_repair_says_why():
    from skulk.shared.types.commands import GenerateText
    from skulk.shared.types.state import RepairFailure

    failure = RepairFailure(instance_id="i1", node_id="b", repair_hop=2, reason="node b refused its shard")
    state = State(repair_failures={MLX.model_id: failure})
    params = TextGenerationParams(model_id=MLX.model_id, messages=[ChatMessage(role="user", content="hi")])
    (event,) = decide(state, GenerateText(command_id="g", params=params), ctx({}, origin="api"))
    assert event.task.status == "Failed"
    assert "could not be repaired: node b refused its shard" in event.task.error_message
    assert "place_instance" in event.task.error_message
