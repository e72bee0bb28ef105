"""The `vllm` engine: a model served by a `vllm serve` process this runner owns.

The same served path as llama-server (`process.ServerProcess`: loopback port, process
group, death with the runner, health deadline), with vLLM's launcher: `--max-num-seqs N`
concurrent sequences (the shard's stamped slots: the node's
SKULK_VLLM_MAX_CONCURRENT_REQUESTS; vLLM pages one KV pool, so slots cost no KV), the context capped at
`VLLM_CONTEXT_CAP_TOKENS` (vLLM commits its whole window at start). vLLM forks engine-core
processes; teardown kills the whole group, and `load` first sweeps engine cores orphaned by
an earlier runner that died before its teardown (they hold GPU memory until killed).

It runs only where a CUDA GPU is visible (`load` refuses, typed, elsewhere). Streams go
through /v1/completions (raw prompts) and /v1/chat/completions (messages, the model's own
template). Forced tool calls and logprobs are refused, typed: this engine does not apply
them yet, and a silently ignored field would be a bug.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from skulk.shared.memory_estimate import VLLM_CONTEXT_CAP_TOKENS
from skulk.shared.reasoning_switches import template_kwargs
from skulk.shared.settings import setting
from skulk.shared.types.cards import backend_engine
from skulk.shared.types.common import FinishReason
from skulk.shared.types.node_facts import ENGINE_BINARY_ENV
from skulk.shared.types.speculative import VLLM_SPECULATIVE_CONFIGS
from skulk.shared.types.stream_errors import StreamErrorType
from skulk.shared.types.tasks import TextGenerationParams
from skulk.worker.engines.base import (
    EngineError,
    GeneratedToken,
    ModelLoadFailed,
    ShardSpec,
    chat_message_dict,
    usage_of,
)
from skulk.worker.engines.served.launch import HOST, ServedRequestRejected, assigned_slots, server_env
from skulk.worker.engines.served.process import ServedEngineShell, start_healthy
from skulk.worker.engines.token_loop import relay_served

log = logging.getLogger(__name__)

ENGINE_CORE_NAMES: tuple[str, ...] = ("VLLM::EngineCore", "VLLM::EngineCore_0")
"""Process titles vLLM gives its engine-core children."""
SERVED_NAME = "skulk"
READ_TIMEOUT_S = 600.0

FINISH_REASONS: dict[str, FinishReason] = {"stop": "stop", "length": "length"}


class VllmUnavailable(ModelLoadFailed):
    error_type = StreamErrorType.ENGINE_UNAVAILABLE


def vllm_argv(binary: str, model: str, port: int, seqs: int, context_tokens: int,
              speculative: str | None = None) -> list[str]:
    """`vllm serve`'s command line; `speculative` is the card's method (`runtime.speculative`),
    which placement admitted only where vLLM serves it (`VLLM_SPECULATIVE_CONFIGS`)."""
    config = VLLM_SPECULATIVE_CONFIGS.get(speculative or "none")
    return [
        binary, "serve", model,
        "--host", HOST, "--port", str(port),
        "--served-model-name", SERVED_NAME,
        "--max-num-seqs", str(seqs),
        "--max-model-len", str(min(context_tokens, VLLM_CONTEXT_CAP_TOKENS)),
        *(("--speculative-config", json.dumps(dict(config), separators=(",", ":"))) if config is not None else ()),
    ]


@dataclass(frozen=True)
class ProcessView:
    """What the orphan sweep needs to know about one process."""

    pid: int
    name: str
    parent_pid: int


def orphaned_engine_cores(processes: Sequence[ProcessView]) -> list[int]:
    """Engine cores whose parent is gone (re-parented to init): left by a runner that died
    before its teardown. A live vLLM's engine core has its api server as parent."""
    return [p.pid for p in processes if p.name in ENGINE_CORE_NAMES and p.parent_pid == 1]


def refusal(request: TextGenerationParams) -> str | None:
    """Why this engine cannot honour `request`, or None."""
    if request.logprobs:
        return "logprobs are not supported by the vllm engine yet"
    if request.tool_choice not in (None, "auto", "none"):
        return "forced tool calls (tool_choice) are not supported by the vllm engine yet"
    return None


def request_body(request: TextGenerationParams, reasoning_switches: Sequence[str]) -> tuple[str, dict[str, Any]]:
    """The path and JSON body vLLM's OpenAI server is sent for `request`: a raw prompt to
    /v1/completions, messages to /v1/chat/completions (vLLM renders the template, so the
    card's reasoning switches ride along as `chat_template_kwargs`, and a turn's opening
    text, `continue_from`, is a final assistant message it continues)."""
    body: dict[str, Any] = {
        "model": SERVED_NAME, "stream": True, "stream_options": {"include_usage": True},
        "max_tokens": request.max_tokens, "stop": list(request.stop) or None,
    }
    for name in ("temperature", "top_p", "top_k", "min_p", "seed"):
        if getattr(request, name) is not None:
            body[name] = getattr(request, name)
    if request.prompt is not None:
        return "/v1/completions", {**body, "prompt": request.prompt}
    body["messages"] = [chat_message_dict(m) for m in request.messages]
    if request.continue_from is not None:
        body["messages"].append({"role": "assistant", "content": request.continue_from})
        body["continue_final_message"], body["add_generation_prompt"] = True, False
    switches = template_kwargs(reasoning_switches, request.thinking, request.reasoning_effort)
    if switches:
        body["chat_template_kwargs"] = switches
    return "/v1/chat/completions", body


def tokens_of_chunk(chunk: Mapping[str, Any]) -> list[GeneratedToken]:
    """One OpenAI-style stream chunk (completions or chat) -> tokens."""
    out: list[GeneratedToken] = []
    for choice in chunk.get("choices") or ():
        text = choice.get("text")
        if text is None:
            text = (choice.get("delta") or {}).get("content") or ""
        finish = FINISH_REASONS.get(choice.get("finish_reason") or "")
        if text or finish:
            out.append(GeneratedToken(text, None, finish, None))
    usage = chunk.get("usage")
    if usage and out and out[-1].finish_reason is not None:
        last = out[-1]
        out[-1] = GeneratedToken(last.text, None, last.finish_reason,
                                 usage_of(int(usage.get("prompt_tokens", 0)), int(usage.get("completion_tokens", 0))))
    return out


def _cuda_visible() -> bool:
    from skulk.facts.nvml import collect_gpus

    return bool(collect_gpus())


def _sweep_orphans() -> None:
    import psutil

    views = []
    for process in psutil.process_iter(["pid", "name", "ppid"]):
        info = process.info
        views.append(ProcessView(info["pid"], info.get("name") or "", info.get("ppid") or 0))
    for pid in orphaned_engine_cores(views):
        log.warning("killing orphaned vLLM engine core %d", pid)
        try:
            psutil.Process(pid).kill()
        except psutil.Error:
            pass


class VllmEngine(ServedEngineShell):
    """`Engine` over a `vllm serve` process. Width: its max concurrent sequences."""

    def __init__(self, env: Mapping[str, str] | None = None) -> None:
        super().__init__()
        self._env = dict(os.environ if env is None else env)
        self._seqs = 1
        self._reasoning_switches: tuple[str, ...] = ()

    @property
    def concurrency(self) -> int:
        return self._seqs

    def load(self, spec: ShardSpec) -> None:
        if backend_engine(spec.shard.backend) != "vllm":
            raise ModelLoadFailed(f"shard backend {spec.shard.backend!r} is not a vllm backend")
        seqs = assigned_slots("vllm", spec.shard.slots)  # placement stamps the node's setting
        binary = setting(ENGINE_BINARY_ENV["vllm"], self._env)
        if not binary:
            raise VllmUnavailable(f"no vLLM: set {ENGINE_BINARY_ENV['vllm']} to the `vllm` executable of its venv")
        if not _cuda_visible():
            raise VllmUnavailable("vLLM needs a CUDA GPU and NVML sees none on this node")
        if not Path(spec.model_path).exists():
            raise ModelLoadFailed(f"model not found: {spec.model_path}")
        _sweep_orphans()
        context = min(spec.instance.context_token_limit, spec.card.context_length)
        server = start_healthy(lambda port: vllm_argv(binary, spec.model_path, port, seqs, context,
                                                      spec.card.runtime.speculative),
                               server_env(self._env))
        self._server, self._seqs = server, seqs
        self._reasoning_switches = spec.card.reasoning.switches
        self._client = httpx.Client(base_url=server.base_url, timeout=httpx.Timeout(READ_TIMEOUT_S, connect=5.0),
                                    limits=httpx.Limits(max_connections=seqs + 2))

    def warm_up(self) -> None:
        client = self._require_loaded()
        response = client.post("/v1/completions", json={"model": SERVED_NAME, "prompt": "Hello", "max_tokens": 1})
        if response.status_code != 200:
            raise ModelLoadFailed(f"vLLM warm-up failed ({response.status_code}): {response.text[:500]}")

    def generate(self, request: TextGenerationParams, cancelled: threading.Event) -> Iterator[GeneratedToken]:
        client = self._require_loaded()
        why = refusal(request)
        if why is not None:
            raise ServedRequestRejected(why)
        yield from self._counted(self._stream(client, request, cancelled))

    def _stream(self, client: httpx.Client, request: TextGenerationParams, cancelled: threading.Event) -> Iterator[GeneratedToken]:
        path, body = request_body(request, self._reasoning_switches)
        finish: GeneratedToken | None = None

        def tokens_of_line(line: str) -> Iterator[GeneratedToken]:
            nonlocal finish
            if not line.startswith("data:") or line.strip() == "data: [DONE]":
                return
            chunk = json.loads(line[5:])
            for token in tokens_of_chunk(chunk):
                if token.finish_reason is not None:
                    finish = token  # usage arrives in a later chunk with include_usage
                    continue
                yield token
            usage = chunk.get("usage")
            if usage and finish is not None:
                yield GeneratedToken(finish.text, None, finish.finish_reason, usage_of(
                    int(usage.get("prompt_tokens", 0)), int(usage.get("completion_tokens", 0))))

        try:
            with client.stream("POST", path, json=body) as response:
                if response.status_code != 200:
                    raise EngineError(f"vLLM answered {response.status_code}: {response.read()[:500]!r}")
                # A finish whose usage never came is still the end of the answer.
                yield from relay_served(response.iter_lines(), tokens_of_line, cancelled, at_end=lambda: finish,
                                        unfinished="vLLM ended the stream without a finish reason")
        except httpx.HTTPError as exc:
            raise EngineError(f"vLLM request failed: {exc}") from exc


__all__ = [
    "ProcessView",
    "VllmEngine",
    "VllmUnavailable",
    "orphaned_engine_cores",
    "refusal",
    "request_body",
    "tokens_of_chunk",
    "vllm_argv",
]
