"""Pure functions from the API's JSON to what the CLI prints or sends: table rows, an error
decoded from any of the API's wire shapes, an `unplace` target resolved to instance ids,
`--exclude` names resolved to node ids, and streamed chat deltas. No I/O here."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


class ClientError(Exception):
    """A failure to show the operator: the API's typed error (`status`, `code`) or our own
    (status 0: the node could not be reached, or the target does not exist)."""

    def __init__(self, status: int, code: str | None, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ClientError) and (self.status, self.code, self.message) == (
            other.status, other.code, other.message)

    __hash__ = Exception.__hash__

    def __str__(self) -> str:
        head = f"{self.status} {self.code}" if self.status and self.code else (self.code or str(self.status or ""))
        return f"{head}: {self.message}" if head else self.message


def error_from_response(status: int, text: str) -> ClientError:
    """Decode any of the API's error shapes: Skulk/OpenAI `{error: {code|type, message}}`,
    Anthropic `{type: "error", error: {...}}`, Ollama `{error: "..."}`, FastAPI `{detail}`."""
    try:
        body = json.loads(text)
    except ValueError:
        return ClientError(status, None, text.strip() or f"HTTP {status}")
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict):
            return ClientError(status, error.get("code") or error.get("type"), str(error.get("message", error)))
        if isinstance(error, str):
            return ClientError(status, None, error)
        detail = body.get("detail")
        if isinstance(detail, str):
            return ClientError(status, None, detail)
        if isinstance(detail, list):  # request validation: each problem with its field
            parts = [f"{'.'.join(str(p) for p in d.get('loc', [])[1:])}: {d.get('msg')}" for d in detail]
            return ClientError(status, "invalid_request", "; ".join(parts))
    return ClientError(status, None, text.strip())


def short(node_id: str) -> str:
    return node_id[:8]


def gib(value: int | None) -> str:
    return "-" if value is None else f"{value / 1024**3:.1f} GiB"


def node_names(state: dict[str, Any]) -> dict[str, str]:
    return {node_id: info.get("nodeName") or short(node_id) for node_id, info in state.get("nodes", {}).items()}


def runners_per_node(state: dict[str, Any]) -> dict[str, list[str]]:
    """Node id -> the states of the runners placed on it."""
    out: dict[str, list[str]] = {}
    for instance in state.get("instances", {}).values():
        for shard in instance.get("shards", []):
            status = state.get("runners", {}).get(shard["runnerId"], {})
            out.setdefault(shard["nodeId"], []).append(status.get("state", "Pending"))
    return out


def node_rows(cluster: dict[str, Any], state: dict[str, Any]) -> list[tuple[str, ...]]:
    """One row per member: name, id, role, alive, health (with the first reason), memory
    available/total, backends, runners."""
    health = state.get("nodeHealth", {})
    runners = runners_per_node(state)
    rows = []
    for node in cluster.get("nodes", []):
        node_id = node["nodeId"]
        verdict = health.get(node_id, {"level": "ok", "reasons": []})
        reasons = verdict.get("reasons", [])
        level = verdict.get("level", "ok") + (f": {reasons[0]['message']}" if reasons else "")
        memory = node.get("memory", {})
        role = "master" if node_id == cluster.get("masterNodeId") else "worker"
        rows.append((
            node.get("name") or short(node_id), short(node_id), role, "yes" if node.get("alive") else "no", level,
            f"{gib(memory.get('available'))} / {gib(memory.get('total'))}", ", ".join(node.get("backends", [])),
            ", ".join(runners.get(node_id, [])) or "-",
        ))
    return rows


def instance_rows(state: dict[str, Any]) -> list[tuple[str, ...]]:
    """One row per placed instance: id, model, sharding, nodes (names), runner states, context."""
    names = node_names(state)
    rows = []
    for instance_id, instance in sorted(state.get("instances", {}).items(), key=lambda kv: (kv[1]["modelId"], kv[0])):
        shards = instance.get("shards", [])
        runner_states = [state.get("runners", {}).get(s["runnerId"], {}).get("state", "Pending") for s in shards]
        rows.append((
            instance_id, instance["modelId"], instance.get("sharding", ""),
            ", ".join(names.get(s["nodeId"], short(s["nodeId"])) for s in shards),
            ", ".join(runner_states), str(instance.get("contextTokenLimit") or "-"),
        ))
    return rows


def instance_problems(state: dict[str, Any]) -> list[str]:
    """One line per placed runner that is Failed (its node, whether its worker gave up, the
    reason) and per model whose automatic repair stopped (`repairFailures`): what an operator
    must read to know why a model is refused, without digging through /state."""
    names = node_names(state)
    lines = []
    for instance_id, instance in sorted(state.get("instances", {}).items()):
        for shard in instance.get("shards", []):
            status = state.get("runners", {}).get(shard["runnerId"], {})
            if status.get("state") != "Failed":
                continue
            node = names.get(shard["nodeId"], short(shard["nodeId"]))
            gave_up = ", not restarted" if status.get("gaveUp") else ""
            lines.append(f"{instance['modelId']} instance {instance_id}: runner on {node} Failed{gave_up}: "
                         f"{status.get('errorMessage') or 'no reason given'}")
    for model_id, failure in sorted(state.get("repairFailures", {}).items()):
        lines.append(f"{model_id}: automatic repair stopped: {failure.get('reason', 'no reason given')}")
    return lines


def unplace_targets(target: str, state: dict[str, Any]) -> list[str]:
    """The instance ids `skulk unplace TARGET` deletes: that instance, or every instance of
    that model. Raises ClientError when neither matches."""
    instances = state.get("instances", {})
    if target in instances:
        return [target]
    matches = sorted(i for i, body in instances.items() if body.get("modelId") == target)
    if matches:
        return matches
    raise ClientError(0, "not_found", f"no instance and no placed model named {target!r}; see `skulk ps`")


def resolve_nodes(given: list[str], state: dict[str, Any]) -> list[str]:
    """`--exclude` values to node ids: a full id, a friendly name, or a unique id prefix.
    Raises ClientError naming a value that matches no node (or several)."""
    names = node_names(state)
    resolved = []
    for value in given:
        if value in names:
            resolved.append(value)
            continue
        by_name = [n for n, name in names.items() if name == value]
        by_prefix = [n for n in names if n.startswith(value)]
        candidates = by_name or by_prefix
        if len(candidates) != 1:
            known = ", ".join(f"{name} ({short(n)})" for n, name in sorted(names.items()))
            what = "matches several nodes" if candidates else "is no node of this cluster"
            raise ClientError(0, "unknown_node", f"{value!r} {what}; nodes: {known}")
        resolved.append(candidates[0])
    return resolved


def preview_rows(preview: dict[str, Any], state: dict[str, Any]) -> list[tuple[str, ...]]:
    """One row per shard of a placement: node, rank, layers, backend, slots (with the
    node's setting when placement had to grant fewer)."""
    names = node_names(state)
    return [
        (names.get(s["nodeId"], short(s["nodeId"])), str(s.get("rank", 0)),
         f"{s.get('startLayer')}-{s.get('endLayer')}", s.get("backend", ""), _slots_cell(s))
        for s in preview.get("shards", [])
    ]


def _slots_cell(shard: dict[str, Any]) -> str:
    slots, wanted = shard.get("slots", 1), shard.get("slotsWanted")
    return f"{slots} (of {wanted})" if wanted else str(slots)


@dataclass(frozen=True)
class ChatDelta:
    """What one streamed chunk adds: answer text, reasoning text, and the finish reason."""

    content: str = ""
    reasoning: str = ""
    finish_reason: str | None = None
    error: ClientError | None = None


def chat_delta(data: str) -> ChatDelta | None:
    """One `data:` payload of an OpenAI chat stream; None for `[DONE]` and usage-only chunks.
    A mid-stream error object becomes `error`."""
    if data.strip() == "[DONE]":
        return None
    body = json.loads(data)
    if "error" in body:
        error = body["error"]
        return ChatDelta(error=ClientError(0, error.get("code") or error.get("type"), error.get("message", "")))
    choices = body.get("choices") or []
    if not choices:
        return None
    delta = choices[0].get("delta") or {}
    return ChatDelta(content=delta.get("content") or "", reasoning=delta.get("reasoning_content") or "",
                     finish_reason=choices[0].get("finish_reason"))
