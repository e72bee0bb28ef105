"""Cold-start restore: remembered placements placed again by capacity on the nodes that came
back (new ids), one per pass, exclusions by name, narrowed after a wait."""

from __future__ import annotations

import itertools

from skulk.master.restore import RESTORE_NARROW_AFTER_S, restore_step
from skulk.shared.intent import PlacementIntent
from skulk.shared.types.state import NodeInfo, State
from tests.master.test_repair import CARDS, GB, MLX, members, res


def _ids():
    counter = itertools.count()
    return lambda: f"id{next(counter)}"


def _back(*names: str) -> State:
    """The nodes that came back: new ids, old names."""
    infos, edges = members(*(f"new-{n}" for n in names))
    infos = {i: NodeInfo(node_id=i, node_name=i.removeprefix("new-"), version="0") for i in infos}
    return State(nodes=infos, edges=edges)


def test_a_remembered_placement_lands_on_the_nodes_that_came_back_keeping_exclusions_by_name() -> None:
    state = _back("alpha", "beta")
    wanted = PlacementIntent(model_id=MLX.model_id, min_nodes=1, excluded_node_names=["alpha"])
    step = restore_step([wanted], state, CARDS, {n: res(n, 8 * GB) for n in state.nodes}, waited_s=0, new_id=_ids())
    assert step.created is not None and step.waiting == ()
    assert step.created.instance.node_ids() == ["new-beta"]
    assert step.created.instance.excluded_nodes == ["new-alpha"]


def test_one_placement_per_pass_and_placed_models_count_as_done() -> None:
    state = _back("alpha", "beta")
    first = PlacementIntent(model_id=MLX.model_id)
    second = PlacementIntent(model_id="mlx-community/Llama-3.2-3B-Instruct-4bit")
    resources = {n: res(n, 8 * GB) for n in state.nodes}
    step = restore_step([first, second], state, CARDS, resources, waited_s=0, new_id=_ids())
    assert step.created is not None and step.created.instance.model_id == MLX.model_id
    assert [w.model_id for w, _ in step.waiting] == [second.model_id]
    placed = state.model_copy(update={"instances": {step.created.instance.instance_id: step.created.instance}})
    again = restore_step([first], placed, CARDS, resources, waited_s=0, new_id=_ids())
    assert again.created is None and again.waiting == ()


def test_a_wide_placement_waits_for_its_nodes_then_narrows() -> None:
    state = _back("alpha")
    wanted = PlacementIntent(model_id=MLX.model_id, min_nodes=2)
    resources = {n: res(n, 8 * GB) for n in state.nodes}
    early = restore_step([wanted], state, CARDS, resources, waited_s=1.0, new_id=_ids())
    assert early.created is None and early.waiting[0][1]  # waits, saying why
    late = restore_step([wanted], state, CARDS, resources, waited_s=RESTORE_NARROW_AFTER_S, new_id=_ids())
    assert late.created is not None and late.created.instance.node_ids() == ["new-alpha"]


def test_a_model_without_a_card_waits_with_the_reason() -> None:
    state = _back("alpha")
    step = restore_step([PlacementIntent(model_id="acme/unknown")], state, CARDS,
                        {n: res(n, 8 * GB) for n in state.nodes}, waited_s=0, new_id=_ids())
    assert step.created is None and "acme/unknown" in step.waiting[0][1]
