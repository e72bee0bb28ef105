"""Opt-in field telemetry's switch and preview over HTTP (docs/TELEMETRY.md); operator routes.

`GET /v1/telemetry`: whether this node collects and sends, why not (the operator's consent,
SKULK_TELEMETRY_DISABLE), where to, the install id, the queue and its counters.
`PUT /v1/telemetry` `{"enabled": bool}`: the dashboard's consent switch, saved in skulk.yaml
so it survives a restart; refused (409 `telemetry_disabled_by_env`) when the environment
forbids telemetry. `GET /v1/telemetry/preview`: the batch the next flush would POST, exactly.
Thin: the node's collector (`skulk.observe.field_collector`) decides and keeps everything.
"""

from __future__ import annotations

from fastapi import APIRouter, Request

from skulk.api.context import ApiContext, api_context
from skulk.api.errors import ApiError, Conflict
from skulk.observe.field_collector import TelemetryConfigUnwritable, TelemetryDisabledByEnv
from skulk.observe.field_telemetry import TelemetryPreview, TelemetryStatus, TelemetrySwitch

router = APIRouter()

TELEMETRY_PATH = "/v1/telemetry"
PREVIEW_PATH = "/v1/telemetry/preview"


class TelemetryUnavailable(ApiError):
    kind = "unavailable"
    default_code = "telemetry_unavailable"


def _unavailable() -> TelemetryUnavailable:
    return TelemetryUnavailable("this node runs no field telemetry collector")


def _context(request: Request) -> ApiContext:
    return api_context(request)


@router.get(TELEMETRY_PATH)
async def telemetry_status(request: Request) -> TelemetryStatus:
    context = _context(request)
    if context.get_telemetry_status is None:
        raise _unavailable()
    return context.get_telemetry_status()


@router.put(TELEMETRY_PATH)
async def set_telemetry(request: Request, body: TelemetrySwitch) -> TelemetryStatus:
    context = _context(request)
    if context.set_telemetry_enabled is None:
        raise _unavailable()
    try:
        return await context.set_telemetry_enabled(body.enabled)
    except TelemetryDisabledByEnv as exc:
        raise Conflict(str(exc), param="enabled", code="telemetry_disabled_by_env") from None
    except TelemetryConfigUnwritable as exc:
        raise Conflict(str(exc), code="telemetry_config_unwritable") from None


@router.get(PREVIEW_PATH)
async def telemetry_preview(request: Request) -> TelemetryPreview:
    context = _context(request)
    if context.preview_telemetry is None:
        raise _unavailable()
    return context.preview_telemetry()


__all__ = ["PREVIEW_PATH", "TELEMETRY_PATH", "router"]
