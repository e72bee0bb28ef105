"""Placement control: dry-run and place a model, preview placements, inspect and delete instances.

`POST /place_instance` runs the same pure planner the master runs, against this node's
replicated State and telemetry, before it publishes anything: an impossible placement is a
400 with the planner's reason (per-node memory arithmetic included), cluster info still
gossiping is a 503 (including a multi-node MLX placement one of whose nodes has not reported
its network yet: it would get no ring hosts, and its runners would refuse to load), and a
feasible one is submitted with the instance id chosen here.
Previews and `GET /models` also show the capacity planner's outputs for each placement.
"""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from skulk.api.context import api_context
from skulk.master.placement import PlacementError, PlacementInfoPending, PlacementRequest, place, preview
from skulk.master.ring_hosts import unreported_ring_nodes
from skulk.shared.slots import DEFAULT_SLOTS, slot_choices
from skulk.shared.types.commands import DeleteInstance, PlaceInstance
from skulk.shared.types.ids import CommandId, InstanceId, ModelId, NodeId, new_id
from skulk.shared.types.kv_cache import KvCacheType, chosen_kv_cache_type

router = APIRouter()


class PlaceInstanceBody(BaseModel):
    model_config = ConfigDict(extra="forbid", alias_generator=to_camel, populate_by_name=True)
    model_id: ModelId
    sharding: Literal["Pipeline", "Tensor"] = "Pipeline"
    min_nodes: int = Field(default=1, ge=1)
    excluded_nodes: list[NodeId] = []
    dry_run: bool = False
    """Answer with the placement the planner would make, and submit nothing."""
    idle_ttl: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    """Seconds idle after which the instance's runners unload their model (reloading on
    the next request); unset: always loaded."""
    slots: int | None = None
    """Requests a served engine (llama-server, vLLM) of this instance decodes at once,
    instead of the node's setting; refused as `invalid_slot_setting` (naming the bound)
    for an engine without slots, a count outside the engine's range, or KV for that many
    slots that does not fit."""
    kv_cache_type: KvCacheType | None = None
    """The KV cache's element type: f16, q8_0 or q4_0 (unset: the card's
    `runtime.kv_cache_backend`, else this node's `kv_cache_backend`). A quantized cache
    admits a longer context in the same memory; refused as `kv_cache_type_unsupported` where
    no engine of the model can hold it."""


def _placement_error(exc: PlacementError) -> JSONResponse:
    status = 503 if isinstance(exc, PlacementInfoPending) else 400
    return JSONResponse(status_code=status, content={"error": {"code": exc.code, "message": str(exc)}})


@router.post("/place_instance")
async def place_instance(request: Request, body: PlaceInstanceBody) -> Any:
    context = api_context(request)
    card = context.get_cards().get(body.model_id)
    if card is None:
        return JSONResponse(status_code=404, content={"error": {
            "code": "unknown_model",
            "message": f"no model card for {body.model_id}; see GET /models for the models this cluster knows",
        }})
    placement_request = PlacementRequest(
        model_id=body.model_id, sharding=body.sharding, min_nodes=body.min_nodes,
        excluded_nodes=frozenset(body.excluded_nodes), slots=body.slots,
        kv_cache_type=body.kv_cache_type, default_kv_cache_type=context.kv_cache_type,
    )
    state = context.get_state()
    try:
        instance = place(card, state, context.get_resources(), placement_request, new_id=new_id)
        unreported = unreported_ring_nodes(instance, state)
        if unreported:
            raise PlacementInfoPending("ring addresses not reported yet", unreported)
    except PlacementError as exc:
        return _placement_error(exc)
    if body.idle_ttl is not None:
        instance = instance.model_copy(update={"idle_ttl_s": body.idle_ttl})
    if body.dry_run:
        return {"instanceId": None, "dryRun": True, "preview": instance.to_wire()}
    command = PlaceInstance(
        command_id=CommandId(new_id()), model_id=body.model_id, sharding=body.sharding, min_nodes=body.min_nodes,
        excluded_nodes=sorted(body.excluded_nodes), instance_id=instance.instance_id, idle_ttl_s=body.idle_ttl,
        slots=body.slots, kv_cache_type=body.kv_cache_type, default_kv_cache_type=context.kv_cache_type,
    )
    await context.submit_command(command)
    return {"instanceId": instance.instance_id, "commandId": command.command_id, "preview": instance.to_wire()}


@router.get("/instance/previews")
def instance_previews(request: Request, modelId: str, slots: int | None = None, kvCacheType: str | None = None) -> Any:
    """Every feasible placement, best first; with `slots`, those serving that many; with
    `kvCacheType` (f16, q8_0, q4_0), admitted with that KV cache (unset: the card's, else
    this node's). `slotChoices` names the engines with slots this model can be placed on in
    this cluster (each with its range and default), so a form offers a slot count only where
    one applies."""
    context = api_context(request)
    card = context.get_cards().get(ModelId(modelId))
    if card is None:
        raise HTTPException(404, f"no model card for {modelId}")
    state, resources = context.get_state(), context.get_resources()
    try:
        kv_type = chosen_kv_cache_type(kvCacheType, card.runtime.kv_cache_backend, context.kv_cache_type)
    except ValueError as exc:
        return JSONResponse(status_code=400, content={"error": {"code": "invalid_kv_cache_type", "message": str(exc)}})
    try:
        options = preview(card, state, resources, slots=slots, kv_cache_type=kv_type)
    except PlacementError as exc:
        return _placement_error(exc)
    choices = slot_choices(card.placement.compatible_backends,
                           (reading.backends for node_id, reading in resources.items() if node_id in state.nodes))
    return {"modelId": modelId, "previews": [_wire(option) for option in options],
            "slotChoices": [{"engine": engine, "min": 1, "max": most, "default": DEFAULT_SLOTS[engine]}
                            for engine, most in choices.items()]}


def _wire(value: Any) -> Any:
    if hasattr(value, "to_wire"):
        return value.to_wire()
    if hasattr(value, "__dataclass_fields__"):
        return {to_camel(k): _wire(getattr(value, k)) for k in value.__dataclass_fields__}
    if isinstance(value, list | tuple | frozenset | set):
        return [_wire(v) for v in value]
    if isinstance(value, dict):
        return {k: _wire(v) for k, v in value.items()}
    return value


@router.get("/instance/{instance_id}")
def get_instance(request: Request, instance_id: str) -> Any:
    state = api_context(request).get_state()
    instance = state.instances.get(InstanceId(instance_id))
    if instance is None:
        raise HTTPException(404, f"no instance {instance_id}")
    body = instance.to_wire()
    body["runners"] = {r: state.runners[r].to_wire() for r in instance.runner_ids() if r in state.runners}
    return body


@router.delete("/instance/{instance_id}")
async def delete_instance(request: Request, instance_id: str) -> Any:
    context = api_context(request)
    if instance_id not in context.get_state().instances:
        raise HTTPException(404, f"no instance {instance_id}")
    command = DeleteInstance(command_id=CommandId(new_id()), instance_id=InstanceId(instance_id))
    await context.submit_command(command)
    return {"instanceId": instance_id, "commandId": command.command_id, "deleting": True}


@router.get("/models")
def list_models(request: Request) -> Any:
    """Every card this node resolves; a model with placed instances also lists them, each
    with its stamped context and the capacity planner's outputs (effective context, hot KV
    tokens, GPU layers), and a model whose last repair was abandoned says why."""
    context = api_context(request)
    cards = context.get_cards()
    state = context.get_state()
    placed: dict[str, list[dict[str, Any]]] = {}
    for instance in sorted(context.list_instances(), key=lambda i: i.instance_id):
        placed.setdefault(instance.model_id, []).append(_placed_entry(instance))
    models = []
    for model_id in sorted(cards):
        entry = cards[model_id].to_wire()
        if model_id in placed:
            entry["instances"] = placed[model_id]
        failure = state.repair_failures.get(model_id)
        if failure is not None:
            entry["repairFailure"] = failure.to_wire()
        models.append(entry)
    return {"models": models}


def _placed_entry(instance: Any) -> dict[str, Any]:
    return {
        "instanceId": instance.instance_id,
        "nodeIds": instance.node_ids(),
        "contextTokenLimit": instance.context_token_limit,
        "repairHop": instance.repair_hop,
        "capacity": instance.capacity.to_wire() if instance.capacity is not None else None,
    }
