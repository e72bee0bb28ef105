"""Cluster diagnostics: the asking node gathers every member's own report
(`GET /v1/diagnostics/node`) with a deadline, lists the members that did not answer as
unreachable (with why), and says whether the members run different versions.

The gathering is a thin async shell over `skulk.observe.peer_http.get_from_peer`; the
report's shape is decided by the pure `cluster_report`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from skulk.observe.peer_http import PEER_REQUEST_DEADLINE_S, PeerRequestFailed, get_from_peer
from skulk.shared.types.ids import NodeId
from skulk.shared.types.state import State

NODE_REPORT_PATH = "/v1/diagnostics/node"


@dataclass(frozen=True)
class PeerAnswer:
    """One peer's answer to a gathering request: its JSON body, or why there is none."""

    body: Any = None
    error: str | None = None
    status: int | None = None
    """The HTTP status of a refusal (None: answered, or no answer at all)."""

    @property
    def reachable(self) -> bool:
        return self.error is None


NO_API = "the node advertises no API endpoint (started with --no-api, or not known yet)"


async def gather_from_peers(
    urls: Mapping[str, str | None], path: str, *, api_key: str | None,
    deadline_s: float = PEER_REQUEST_DEADLINE_S, headers: Mapping[str, str] | None = None,
) -> dict[str, PeerAnswer]:
    """GET `path` on every peer in `urls` at once; each answer within `deadline_s` or
    unreachable. Never raises for a peer's failure."""
    async with httpx.AsyncClient() as client:
        async def ask(url: str | None) -> PeerAnswer:
            if url is None:
                return PeerAnswer(error=NO_API)
            try:
                return PeerAnswer(body=await get_from_peer(client, url, path, api_key=api_key, deadline_s=deadline_s,
                                                           headers=headers))
            except PeerRequestFailed as exc:
                return PeerAnswer(error=f"{url}: {exc}", status=exc.status)

        node_ids = list(urls)
        answers = await asyncio.gather(*(ask(urls[n]) for n in node_ids))
    return dict(zip(node_ids, answers, strict=True))


def version_report(versions: Mapping[str, str | None]) -> dict[str, Any]:
    """Which version each member runs and whether they differ (`skew`). Pure."""
    distinct = sorted({v for v in versions.values() if v})
    return {"byNode": dict(sorted(versions.items())), "distinct": distinct, "skew": len(distinct) > 1}


TIMELINE_MAX_RECORDS = 4096
"""Records in one merged timeline (the newest are kept): four nodes' full recorders."""


def cluster_timeline(report: Mapping[str, Any], limit: int = TIMELINE_MAX_RECORDS) -> list[dict[str, Any]]:
    """Every reachable node's flight-recorder records in one wall-clock order, each tagged
    with its node: rank disagreement in a distributed hang (one node saw an event the
    others did not) shows at a glance. The newest `limit` records. Pure."""
    merged: list[dict[str, Any]] = []
    for node_id, entry in (report.get("nodes") or {}).items():
        if not entry.get("reachable"):
            continue
        recorder = (entry.get("diagnostics") or {}).get("flightRecorder") or {}
        merged.extend({**record, "nodeId": node_id} for record in recorder.get("records") or ())
    merged.sort(key=lambda record: (record.get("at", 0.0), record["nodeId"]))
    return merged[-limit:]


def cluster_report(me: str, own: Mapping[str, Any], answers: Mapping[str, PeerAnswer], state: State) -> dict[str, Any]:
    """The cluster diagnostics body: every member of `state` (and this node) with its own
    report or why it is unreachable, plus versions and skew. Pure."""
    nodes: dict[str, Any] = {}
    versions: dict[str, str | None] = {}
    member_ids = sorted({*state.nodes, me, *answers})
    for node_id in member_ids:
        info = state.nodes.get(NodeId(node_id))
        name = info.node_name if info else None
        if node_id == me:
            nodes[node_id] = {"nodeId": node_id, "name": own.get("nodeName", name), "reachable": True,
                              "diagnostics": dict(own)}
            versions[node_id] = own.get("version")
            continue
        answer = answers.get(node_id, PeerAnswer(error="not asked"))
        if answer.reachable and isinstance(answer.body, Mapping):
            nodes[node_id] = {"nodeId": node_id, "name": name, "reachable": True, "diagnostics": answer.body}
            versions[node_id] = answer.body.get("version") or (info.version if info else None)
        else:
            error = answer.error or "the answer was not a diagnostics report"
            nodes[node_id] = {"nodeId": node_id, "name": name, "reachable": False, "error": error}
            versions[node_id] = info.version if info else None
    return {
        "nodeId": me,
        "nodes": nodes,
        "unreachable": sorted(n for n, entry in nodes.items() if not entry["reachable"]),
        "versions": version_report(versions),
    }
