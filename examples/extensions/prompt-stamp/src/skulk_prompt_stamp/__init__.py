"""prompt-stamp: a worked example of a Skulk extension (see docs/EXTENSIONS.md).

The entry point `prompt-stamp = skulk_prompt_stamp:make` (pyproject.toml) names `make`, the
zero-argument factory Skulk calls once at node start. The object it returns names itself,
declares the Skulk versions it supports, and defines the hooks it wants; Skulk finds hooks
by attribute and calls each one under a deadline, guarded.
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import asdict
from typing import TYPE_CHECKING

from skulk.shared.types.common import ChatMessage

if TYPE_CHECKING:  # types only: Skulk passes these in
    from skulk.extensions.context import ExtensionContext
    from skulk.extensions.summary import ChatResponseSummary
    from skulk.shared.types.tasks import TextGenerationParams

DEFAULT_TEXT = "Answer as briefly as you can."
TAG = "prompt-stamp"


class PromptStamp:
    name = "prompt-stamp"
    version = "0.1.0"
    skulk_versions = ">=0.1,<0.2"
    """Checked against the running Skulk at load time: a node of another version skips this
    extension with the reason, shown in `skulk doctor` and /v1/diagnostics/node."""

    def __init__(self, text: str, log_path: str | None, failure_policy: str) -> None:
        self.text = text
        self.log_path = log_path
        self.failure_policy = failure_policy
        self._lock = threading.Lock()

    # Chat middleware. A plain (sync) function: Skulk runs it on a worker thread under its
    # deadline, so it may block briefly (a file, a lookup) without stalling the node.
    def transform_chat_request(self, params: TextGenerationParams, ctx: ExtensionContext) -> TextGenerationParams:
        messages = list(params.messages)
        if messages and messages[0].role == "system":
            first = messages[0]
            messages[0] = first.model_copy(update={"content": f"{first.content or ''}\n\n{self.text}".strip()})
        else:
            messages.insert(0, ChatMessage(role="system", content=self.text))
        # Params are frozen: return a copy. The model may not change (Skulk refuses that).
        return params.model_copy(update={"messages": messages})

    # Called once per finished response, in the background, with a frozen summary.
    def observe_chat_response(self, summary: ChatResponseSummary, ctx: ExtensionContext) -> None:
        if self.log_path is None:
            return
        # read_cluster(): the fabric as the telemetry plane describes it, without touching State.
        members = ctx.read_cluster()
        stampers = sorted(node.node_name for node in members if TAG in node.capabilities)
        line = json.dumps({"node": ctx.node_name, "members": len(members), "stampers": stampers, **asdict(summary)})
        with self._lock, open(self.log_path, "a", encoding="utf-8") as log:
            log.write(line + "\n")

    # Once the node's API is up: tell the cluster this node stamps its requests.
    def on_start(self, ctx: ExtensionContext) -> None:
        ctx.advertise_capability(TAG)


def make() -> PromptStamp:
    """The entry point's factory: configuration read once, here."""
    return PromptStamp(
        text=os.environ.get("PROMPT_STAMP_TEXT", DEFAULT_TEXT),
        log_path=os.environ.get("PROMPT_STAMP_LOG") or None,
        failure_policy=os.environ.get("PROMPT_STAMP_POLICY", "skip"),
    )
