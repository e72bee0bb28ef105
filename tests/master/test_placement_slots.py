"""Per-placement slots: an operator's slot count for one placement, admitted exactly or
refused as `invalid_slot_setting` naming the bound (pure placement tables)."""

import pytest

from skulk.master.commands import Refusal, decide
from skulk.master.placement import InvalidSlotSetting, place, preview
from skulk.shared.slots import requested_slots_refusal
from skulk.shared.types.commands import PlaceInstance
from tests.master.test_placement import (
    GB,
    GGUF_8B,
    LLAMA_1B,
    LLAMA_CPU,
    MLX_CPU,
    cluster,
    gguf_whole,
    ids,
    request,
    res,
    served_res,
)
from tests.master.test_repair import ctx, refuse, state_with

SERVED_ONLY = ("llama_server", "llama_server-cpu")


@pytest.mark.parametrize(
    ("name", "backend", "slots", "refusal"),
    [
        ("llama-server takes its range", "llama_server-cpu", 8, None),
        ("the bound itself", "llama_server-cuda", 64, None),
        ("above llama-server's bound", "llama_server-cpu", 65, "llama_server takes 1..64 slots, not 65"),
        ("zero", "llama_server", 0, "llama_server takes 1..64 slots, not 0"),
        ("vLLM has a wider range", "vllm-cuda", 200, None),
        ("in-process llama.cpp has no slots", "llama_cpp-cpu", 2, "llama_cpp-cpu has no slots"),
        ("MLX has no slots", "mlx-metal", 2, "mlx-metal has no slots"),
    ],
)
def test_requested_slots_refusal(name, backend, slots, refusal):
    found = requested_slots_refusal(backend, slots)
    assert (found is None) == (refusal is None), name
    if refusal is not None:
        assert refusal in found, name


@pytest.mark.parametrize(
    ("name", "reading", "slots", "backend"),
    [
        ("more than the node's setting, when KV for all of them fits",
         served_res("a", gguf_whole(8) + GB, slots=2), 8, "llama_server-cpu"),
        ("fewer than the node's setting",
         served_res("a", gguf_whole(8) + GB, slots=8), 2, "llama_server-cpu"),
        ("one slot",
         served_res("a", gguf_whole(1) + GB), 1, "llama_server-cpu"),
    ],
)
def test_requested_slots_are_stamped_exactly(name, reading, slots, backend):
    instance = place(GGUF_8B, cluster("a"), {"a": reading}, request(GGUF_8B, slots=slots), new_id=ids())
    (shard,) = instance.shards
    assert (shard.backend, shard.slots, shard.slots_wanted, instance.requested_slots) == (backend, slots, None, slots), name
    (option,) = preview(GGUF_8B, cluster("a"), {"a": reading}, sharding="Pipeline", slots=slots)
    (shown,) = option.shards
    assert (shown.slots, shown.needed_bytes) == (slots, gguf_whole(slots)), name


def test_a_node_without_a_served_engine_is_passed_over_for_one_with_slots():
    resources = {"a": served_res("a", 60 * GB, backends=LLAMA_CPU), "b": served_res("b", gguf_whole(4) + GB)}
    instance = place(GGUF_8B, cluster(resources, ["a-b"]), resources, request(GGUF_8B, slots=4), new_id=ids())
    assert (instance.node_ids(), instance.shards[0].backend, instance.shards[0].slots) == (["b"], "llama_server-cpu", 4)


@pytest.mark.parametrize(
    ("name", "card", "resources", "req", "says"),
    [
        ("KV for the slots does not fit: the most that do",
         GGUF_8B, {"a": served_res("a", gguf_whole(3) + 1)}, {"slots": 8},
         ["a: KV for 8 llama_server slots does not fit, at most 3 fit", "GB available"]),
        ("not even one slot fits",
         GGUF_8B, {"a": served_res("a", gguf_whole(1) - 1, backends=SERVED_ONLY)}, {"slots": 2},
         ["a: KV for 2 llama_server slots does not fit, not even 1 fits"]),
        ("only in-process engines on the node",
         GGUF_8B, {"a": served_res("a", 60 * GB, backends=LLAMA_CPU)}, {"slots": 4},
         ["a: it serves this model with", "which have no slots", "slots apply to llama_server and vllm"]),
        ("beyond every engine's bound",
         GGUF_8B, {"a": served_res("a", 60 * GB)}, {"slots": 65},
         ["llama_server takes 1..64"]),
        ("zero",
         GGUF_8B, {"a": served_res("a", 60 * GB)}, {"slots": 0},
         ["llama_server takes 1..64"]),
        ("a card with no served engine",
         LLAMA_1B, {"a": res("a", 60 * GB, MLX_CPU)}, {"slots": 4},
         ["none of its backends", "has slots"]),
        ("a multi-node placement",
         GGUF_8B, {"a": served_res("a", 60 * GB)}, {"slots": 4, "min_nodes": 2},
         ["min_nodes=2 asks for a multi-node instance"]),
        ("every node's reason",
         GGUF_8B, {"a": served_res("a", 60 * GB, backends=LLAMA_CPU), "b": served_res("b", gguf_whole(2) + 1)},
         {"slots": 6},
         ["a: it serves this model with", "b: KV for 6 llama_server slots does not fit, at most 2 fit"]),
    ],
)
def test_slots_that_cannot_be_served_are_refused_naming_the_bound(name, card, resources, req, says):
    state = cluster(resources, ["a-b"] if len(resources) > 1 else [])
    with pytest.raises(InvalidSlotSetting) as caught:
        place(card, state, resources, request(card, **req), new_id=ids())
    assert caught.value.code == "invalid_slot_setting"
    for fragment in says:
        assert fragment in str(caught.value), (name, str(caught.value))


def test_a_preview_with_slots_no_engine_takes_is_refused():
    with pytest.raises(InvalidSlotSetting, match=r"llama_server takes 1\.\.64"):
        preview(GGUF_8B, cluster("a"), {"a": served_res("a", 60 * GB)}, slots=100)


def test_the_master_places_the_commanded_slots_and_refuses_bad_ones_typed():
    from tests.master.test_repair import ctx as decision_ctx

    resources = {"a": served_res("a", gguf_whole(8) + GB, slots=2)}
    state = cluster(resources)
    command = PlaceInstance(command_id="c1", model_id=GGUF_8B.model_id, slots=8)
    (created,) = decide(state, command, decision_ctx(resources, origin="a"))
    assert created.instance.shards[0].slots == 8 and created.instance.requested_slots == 8
    refused = decide(state, command.model_copy(update={"slots": 99}), decision_ctx(resources, origin="a"))
    assert isinstance(refused, Refusal) and refused.code == "invalid_slot_setting"


def test_a_repair_places_the_instance_again_with_the_operators_slots():
    resources = {n: served_res(n, gguf_whole(6) + GB, slots=2) for n in ("a", "b", "c")}
    original = place(GGUF_8B, cluster(resources, ["a-b", "b-c", "a-c"]), resources,
                     request(GGUF_8B, slots=6), new_id=ids())
    assert original.node_ids() == ["a"]
    state = state_with(original, ("a", "b", "c"))
    events = decide(state, refuse(original, "a"), ctx(resources, origin="a"))
    (placed,) = [e.instance for e in events if type(e).__name__ == "InstanceCreated"]
    assert "a" not in placed.node_ids()
    assert (placed.shards[0].slots, placed.requested_slots) == (6, 6)


def test_a_restored_placement_keeps_the_operators_slots():
    from skulk.master.restore import restore_step
    from skulk.shared.intent import placement_intent

    resources = {"a": served_res("a", gguf_whole(6) + GB, slots=2)}
    original = place(GGUF_8B, cluster(resources), resources, request(GGUF_8B, slots=6), new_id=ids())
    wanted = placement_intent(original, cluster(resources))
    assert wanted.slots == 6
    step = restore_step([wanted], cluster(resources), {GGUF_8B.model_id: GGUF_8B}, resources, waited_s=0, new_id=ids())
    assert step.created is not None
    assert (step.created.instance.shards[0].slots, step.created.instance.requested_slots) == (6, 6)
