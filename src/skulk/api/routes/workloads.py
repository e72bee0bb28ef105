"""Every one-result workload by its kind, through one route.

`GET /v1/workloads` lists the workload table (`skulk.shared.types.workloads`): each kind,
what it does, and the engines that serve it. `POST /v1/workloads/{kind}` runs a one-result
workload on a placed model: the body is the workload's params with the model named `model`
(`{"model": "...", "text": "..."}` for `echo`), the answer its one result and usage. A
workload added to the table is reachable here with no route of its own; the wire formats
users' SDKs speak (`/v1/embeddings`, `/api/embed`) stay where they are. Text streams and
has its own routes: asking for it here is a 400 that names them.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from pydantic import ValidationError

from skulk.api.context import api_context
from skulk.api.errors import InvalidRequest, NotFound
from skulk.api.generation import collect_result, for_placed_model, start_workload
from skulk.shared.types.engines import ENGINE_TRAITS
from skulk.shared.types.workloads import WORKLOADS

router = APIRouter()


@router.get("/v1/workloads")
async def list_workloads() -> dict[str, Any]:
    return {"workloads": [
        {"kind": kind, "meaning": row.meaning, "oneResult": row.result is not None,
         "engines": sorted(name for name, traits in ENGINE_TRAITS.items() if kind in traits.workloads)}
        for kind, row in WORKLOADS.items()
    ]}


@router.post("/v1/workloads/{kind}")
async def run_workload(request: Request, kind: str, body: dict[str, Any]) -> dict[str, Any]:
    row = WORKLOADS.get(kind)
    if row is None:
        raise NotFound(f"no workload '{kind}'; GET /v1/workloads lists them", code="unknown_workload")
    if row.result is None:
        raise InvalidRequest(f"'{kind}' streams: use /v1/chat/completions, /v1/completions, /v1/messages or "
                             "/api/chat", param="kind")
    fields = dict(body)
    model = fields.pop("model", None)
    if not isinstance(model, str) or not model:
        raise InvalidRequest("'model' is required: the placed model to run it on", param="model")
    if "workload" in fields or "modelId" in fields or "model_id" in fields:
        raise InvalidRequest("the workload and model are named by the path and 'model'", param="model")
    try:
        params = row.params.model_validate({**fields, "modelId": model})
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or None
        raise InvalidRequest(f"{kind}: {first['msg']}", param=where) from None
    context = api_context(request)
    params = for_placed_model(context, params)
    stream = await start_workload(context, params)
    result, usage = await collect_result(request, context, stream, row.result)
    return {"workload": kind, "model": model, "result": result.to_wire(),
            "usage": None if usage is None else usage.to_wire()}
