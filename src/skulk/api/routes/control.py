"""Skulk-native control routes: node identity and the replicated State."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

router = APIRouter()


def _context(request: Request):  # noqa: ANN202 - ApiContext, imported lazily to avoid a cycle
    return request.app.state.skulk


@router.get("/node_id")
def get_node_id(request: Request) -> dict[str, str]:
    return {"nodeId": _context(request).node_id}


@router.get("/state")
def get_state(request: Request) -> dict[str, Any]:
    """Full replicated State (camelCase) plus derived per-node health."""
    body = _context(request).get_state().to_wire()
    body["nodeHealth"] = {}
    return body
