"""Capture bundles: one archive an operator attaches to a bug report, with every reachable
node's flight recorder, diagnostics, recent logs, configuration (secrets redacted by the
node itself, see `skulk.observe.node_report`) and versions, plus the replicated State and
the cluster summary, as the asked node saw them, and every recorder merged into one
wall-clock-ordered `timeline.json`. A node that did not answer is listed in
the manifest as unreachable, with the reason, and still gets a folder saying so.

`capture_files` (pure) decides the archive's layout; `write_archive` writes it as tar.gz;
`fetch_capture_inputs` is the CLI's HTTP shell.
"""

from __future__ import annotations

import io
import json
import re
import tarfile
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

from skulk.observe.cluster_diagnostics import cluster_timeline

CAPTURE_REQUEST_DEADLINE_S = 30.0
"""Deadline of each request the capture makes to the asked node: the cluster report waits
for every member (each within `peer_http.PEER_REQUEST_DEADLINE_S`) before it answers."""

_SPLIT_OUT = ("flightRecorder", "recentLogs", "config", "versions")
"""Sections of a node's report written as files of their own (the rest is diagnostics.json)."""


def _json(value: Any) -> bytes:
    return (json.dumps(value, indent=2, sort_keys=True, default=str) + "\n").encode()


def _folder(node_id: str, name: str | None) -> str:
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", name or "")[:40]
    return f"nodes/{node_id}" + (f"-{safe}" if safe else "")


def capture_files(
    cluster_report: Mapping[str, Any], state: Any, cluster: Any, *, asked_url: str, created_at: datetime,
) -> dict[str, bytes]:
    """Archive path -> content for one capture. Pure."""
    stamp = created_at.strftime("%Y%m%dT%H%M%SZ")
    root = f"skulk-capture-{stamp}"
    files: dict[str, bytes] = {}
    nodes: Mapping[str, Any] = cluster_report.get("nodes") or {}
    manifest_nodes = {}
    for node_id, entry in sorted(nodes.items()):
        folder = f"{root}/{_folder(node_id, entry.get('name'))}"
        manifest_nodes[node_id] = {"name": entry.get("name"), "reachable": bool(entry.get("reachable")),
                                   "folder": folder.removeprefix(root + "/")}
        if not entry.get("reachable"):
            manifest_nodes[node_id]["error"] = entry.get("error")
            files[f"{folder}/UNREACHABLE.txt"] = f"{node_id} did not answer: {entry.get('error')}\n".encode()
            continue
        report = dict(entry.get("diagnostics") or {})
        files[f"{folder}/flight-recorder.json"] = _json(report.get("flightRecorder"))
        files[f"{folder}/recent-logs.txt"] = ("\n".join(report.get("recentLogs") or []) + "\n").encode()
        files[f"{folder}/config.json"] = _json(report.get("config"))
        files[f"{folder}/versions.json"] = _json(report.get("versions"))
        files[f"{folder}/diagnostics.json"] = _json({k: v for k, v in report.items() if k not in _SPLIT_OUT})
    manifest = {
        "createdAt": created_at.isoformat(),
        "askedUrl": asked_url,
        "askedNode": cluster_report.get("nodeId"),
        "nodes": manifest_nodes,
        "unreachable": list(cluster_report.get("unreachable") or []),
        "versions": cluster_report.get("versions"),
    }
    files[f"{root}/manifest.json"] = _json(manifest)
    files[f"{root}/timeline.json"] = _json(cluster_timeline(cluster_report))
    files[f"{root}/state.json"] = _json(state)
    files[f"{root}/cluster.json"] = _json(cluster)
    return files


def write_archive(files: Mapping[str, bytes], path: Path) -> None:
    """Write `files` as a gzip-compressed tar at `path` (atomically: a temp file renamed)."""
    tmp = path.with_name(path.name + ".partial")
    with tarfile.open(tmp, "w:gz") as archive:
        for name, data in sorted(files.items()):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o600
            archive.addfile(info, io.BytesIO(data))
    tmp.replace(path)


class CaptureFailed(Exception):
    """The asked node itself did not answer: nothing to capture; the message says why."""


def fetch_capture_inputs(url: str, api_key: str | None) -> tuple[dict[str, Any], Any, Any]:
    """The cluster report, State and cluster summary from the node at `url`."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    base = url.rstrip("/")
    out = []
    with httpx.Client(headers=headers, timeout=CAPTURE_REQUEST_DEADLINE_S) as client:
        for path in ("/v1/diagnostics/cluster", "/state", "/v1/cluster"):
            try:
                response = client.get(base + path)
            except httpx.HTTPError as exc:
                raise CaptureFailed(f"{base}{path}: {type(exc).__name__}: {exc}") from None
            if response.status_code != 200:
                raise CaptureFailed(f"{base}{path}: HTTP {response.status_code}: {response.text[:300]}")
            out.append(response.json())
    return out[0], out[1], out[2]
