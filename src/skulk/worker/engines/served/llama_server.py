"""The `llama_server` engine: one GGUF served by a llama-server process this runner owns.

`load` starts llama-server on a free loopback port with `--parallel N` slots (N stamped on
the shard assignment by placement, which admitted KV for every slot) and continuous
batching and waits for /health; the engine's width is N, so the runner's dispatcher hands it
N requests at once and llama-server decodes them in one batch. Each request's prompt is
rendered and tokenized here, by the in-process engine's prompt machinery on the GGUF's
vocabulary alone (`LlamaCppEngine.load_tokenizer`): the server gets token ids, so caller text
is never parsed as special tokens and a prompt costs linear time, exactly as in-process.
Then it streams /completion: text, token ids, usage, the stop reason, logprobs on request,
penalties and logit bias, and one GBNF grammar for a forced tool call or a response format
(the grammar the in-process engine uses). A per-request context (`context_tokens`, Ollama's
`num_ctx`) is enforced here too.
Cancelling a request closes its HTTP stream, which frees the slot in the server. Token
streams go over `sse.LoopbackStreams` (plain keep-alive sockets, half httpx's per-event
CPU); the rest (health, warm-up) over httpx.

Images (a vision card, started with its projector, `--mmproj`): a request whose messages
carry images is sent as text instead, the rendered chat with each image marker replaced by
the server's media marker (random per server process, read from /props at load), and the
images' bytes as `multimodal_data`; the server tokenizes it, so caller text holding
special-token text is refused rather than parsed. The prompt length it reports
(`tokens_evaluated`, image tokens included) is the one announced and counted. The server's
own prompt cache keys each image by its hash, so a cached text prefix is never reused past
an image that differs.

Embeddings are not served: llama-server computes them only in an embeddings-only mode, so
an embedding request gets the dispatcher's typed `WorkloadUnsupported`.
This module never decides how many slots or which flags (that is `launch`), and never
handles a process directly (that is `process`).
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx

from skulk.shared.prefix_cache import cold_budget_bytes
from skulk.shared.settings import setting
from skulk.shared.tool_grammar import SchemaNotSupported, request_grammar
from skulk.shared.types.cards import backend_engine
from skulk.shared.types.media import ImageInput
from skulk.shared.types.node_facts import ENGINE_BINARY_ENV
from skulk.shared.types.speculative import LLAMA_SERVER_SPEC_TYPES
from skulk.shared.types.tasks import TextGenerationParams
from skulk.worker.engines.base import (
    EngineBroken,
    EngineError,
    EngineNotLoaded,
    GeneratedToken,
    ModelLoadFailed,
    PromptTooLong,
    ShardSpec,
)
from skulk.worker.engines.llama_cpp.engine import (
    THINK_OPEN,
    GrammarRejected,
    LlamaCppEngine,
    flash_attn_enabled,
    opens_reasoning,
    planned_gpu_layers,
)
from skulk.worker.engines.openmp import physical_cores
from skulk.worker.engines.projector import ProjectorMissing, projector_launch_path
from skulk.worker.engines.served.launch import (
    HOST,
    ServedRequestRejected,
    ServerLaunch,
    assigned_slots,
    completion_body,
    image_prompt,
    server_env,
    tokens_of_event,
)
from skulk.worker.engines.served.process import (
    PORT_ATTEMPTS,
    ServedEngineShell,
    ServerProcess,
    start_healthy,
)
from skulk.worker.engines.served.sse import TRANSPORT_ERRORS, LoopbackStreams
from skulk.worker.engines.token_loop import relay_served

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 5.0
READ_TIMEOUT_S = 600.0
"""Longest silence between two stream events: a prompt waiting behind every other slot's
prompt evaluation on a slow CPU, with margin. Past it the request fails, typed."""
WARM_UP_PROMPT = "Hello"


class ImagesNotServed(ServedRequestRejected):
    """Images sent to a runner whose model has no projector loaded."""


def draft_launch_path(spec: ShardSpec) -> Path | None:
    """The draft GGUF the server loads for a card that speculates with one, or None. A card
    that asks for draft speculation without its draft on this node is refused at load: it
    must not be served as if it did not ask."""
    if spec.card.runtime.speculative != "draft":
        return None
    if spec.draft_model_path is None or not Path(spec.draft_model_path).is_file():
        raise ModelLoadFailed(f"{spec.card.model_id} speculates with the draft model {spec.card.served_spec_draft_repo}, "
                              f"which is not on this node ({spec.draft_model_path or 'not resolved'})")
    return Path(spec.draft_model_path)


class LlamaServerEngine(ServedEngineShell):
    """`Engine` over a llama-server process. Width: its slot count."""

    def __init__(self, env: Mapping[str, str] | None = None, port: int | None = None) -> None:
        super().__init__()
        self._env = dict(os.environ if env is None else env)
        self._fixed_port = port
        self._slots = 1
        self._tokenizer = LlamaCppEngine()
        self._context_tokens = 0
        self._streams: LoopbackStreams | None = None
        self._media_marker: str | None = None
        """The server's media marker when it loaded a projector; None: it sees no images."""

    def close(self) -> None:
        streams, self._streams = self._streams, None
        if streams is not None:
            streams.close()
        super().close()

    # -- protocol -------------------------------------------------------------------------

    @property
    def concurrency(self) -> int:
        return self._slots

    @property
    def server(self) -> ServerProcess | None:
        """The running server (diagnostics and tests)."""
        return self._server

    def _cache_ram_mib(self, spec: ShardSpec) -> int:
        """The cold KV budget in whole MiB, for llama-server's own prompt cache."""
        capacity = spec.instance.capacity
        planned = capacity.cold_budget_bytes if capacity is not None else None
        try:
            return cold_budget_bytes(planned, self._env) // (1024 * 1024)
        except ValueError as exc:
            raise ModelLoadFailed(str(exc)) from exc

    def load(self, spec: ShardSpec) -> None:
        shard = spec.shard
        if backend_engine(shard.backend) != "llama_server":
            raise ModelLoadFailed(f"shard backend {shard.backend!r} is not a llama_server backend")
        if shard.world_size != 1:
            raise ModelLoadFailed("the llama_server engine serves single-node instances only")
        if not Path(spec.model_path).is_file():
            raise ModelLoadFailed(f"GGUF file not found: {spec.model_path}")
        draft = draft_launch_path(spec)
        projector = projector_launch_path(spec)
        slots = assigned_slots("llama_server", shard.slots)  # placement admitted KV for this many
        self._context_tokens = min(spec.instance.context_token_limit, spec.card.context_length)
        self._tokenizer.load_tokenizer(spec.model_path, self._context_tokens, spec.card.reasoning.switches)
        binary = setting(ENGINE_BINARY_ENV["llama_server"], self._env)
        if not binary:
            raise ModelLoadFailed(
                f"no llama-server: set {ENGINE_BINARY_ENV['llama_server']} or run `skulk engines install`"
            )
        launch = ServerLaunch(
            binary=Path(binary).expanduser(),
            model_path=Path(spec.model_path),
            port=0,
            slots=slots,
            context_per_slot=min(spec.instance.context_token_limit, spec.card.context_length),
            threads=spec.n_threads or physical_cores(),
            gpu_layers=planned_gpu_layers(spec),
            flash_attn=flash_attn_enabled(spec.card.runtime.flash_attn, self._env, shard.kv_cache_type),
            cache_ram_mib=self._cache_ram_mib(spec),
            kv_cache_type=shard.kv_cache_type,
            spec_type=LLAMA_SERVER_SPEC_TYPES.get(spec.card.runtime.speculative or "none"),
            draft_model_path=draft,
            projector_path=projector,
        )
        self._server = self._start(launch)
        self._slots = slots
        self._streams = LoopbackStreams(HOST, self._server.port, CONNECT_TIMEOUT_S, READ_TIMEOUT_S, max_idle=slots)
        self._client = httpx.Client(
            base_url=self._server.base_url,
            timeout=httpx.Timeout(READ_TIMEOUT_S, connect=CONNECT_TIMEOUT_S),
            limits=httpx.Limits(max_connections=slots + 2, max_keepalive_connections=slots + 2),
        )
        self._media_marker = self._read_media_marker() if projector is not None else None
        log.info("llama-server pid %d on port %d: %d slots x %d tokens, %s KV cache, speculation %s%s, %s%s",
                 self._server.pid, self._server.port, slots, launch.context_per_slot, launch.kv_cache_type,
                 launch.spec_type or "off", f" (draft {draft})" if draft is not None else "", spec.model_path,
                 f" with projector {projector}" if projector is not None else "")

    def _read_media_marker(self) -> str:
        """The marker the server's multimodal prompts use for an image (random per process)."""
        client = self._require_loaded()
        response = self._call(lambda: client.get("/props"))
        marker = response.json().get("media_marker") if response.status_code == 200 else None
        if not isinstance(marker, str) or not marker:
            raise ModelLoadFailed(f"llama-server loaded the projector but its /props names no media_marker "
                                  f"({response.status_code}): {response.text[:300]}")
        return marker

    def _start(self, launch: ServerLaunch) -> ServerProcess:
        return start_healthy(lambda port: _with_port(launch, port).argv(), server_env(self._env),
                             port=self._fixed_port, attempts=PORT_ATTEMPTS)

    def warm_up(self) -> None:
        client = self._require_loaded()
        response = client.post("/completion", json={"prompt": WARM_UP_PROMPT, "n_predict": 1, "cache_prompt": False})
        if response.status_code != 200:
            raise ModelLoadFailed(f"llama-server warm-up failed ({response.status_code}): {response.text[:500]}")

    def generate(self, request: TextGenerationParams, cancelled: threading.Event) -> Iterator[GeneratedToken]:
        self._require_loaded()
        yield from self._counted(self._generate(request, cancelled))

    # -- internals ----------------------------------------------------------------------

    @property
    def context_tokens(self) -> int:
        return self._context_tokens

    def prompt_tokens(self, request: TextGenerationParams, cancelled: threading.Event | None = None) -> list[int]:
        """The exact tokens the server is sent for `request` (count-only requests use it)."""
        return self._tokenizer.prompt_tokens(request, cancelled)

    def prompt_token_count(self, request: TextGenerationParams) -> int:
        """The prompt's length as the server feeds it (count-only requests): its tokens, or,
        with images, the server's own count (image tokens included), from a request that
        evaluates the prompt and generates nothing kept (it also warms the prompt cache)."""
        images = [image for message in request.messages for image in message.images]
        if not images:
            return len(self.prompt_tokens(request))
        client = self._require_loaded()
        body = {"prompt": self._image_prompt(request, images), "n_predict": 0, "cache_prompt": True}
        response = self._call(lambda: client.post("/completion", json=body))
        if response.status_code != 200:
            raise _server_error(response.status_code, response.text)
        return int(response.json()["tokens_evaluated"])

    def _generate(
        self, request: TextGenerationParams, cancelled: threading.Event
    ) -> Iterator[GeneratedToken]:
        try:
            grammar = request_grammar(request.tools, request.tool_choice, request.response_format)
        except SchemaNotSupported as exc:
            raise GrammarRejected(str(exc)) from exc
        text, tokens = self._tokenizer.prompt_and_tokens(request, cancelled)
        context = min(self._context_tokens, request.context_tokens or self._context_tokens)
        if len(tokens) >= context:
            raise PromptTooLong(len(tokens), context)
        images = [image for message in request.messages for image in message.images]
        # With images the text's own tokens are a lower bound on the prompt (each marker's
        # text stands for its image's tokens): the server refuses an over-long one, typed.
        prompt = self._image_prompt(request, images) if images else tokens
        body = completion_body(request, prompt, grammar, context - len(tokens))
        top = request.top_logprobs or 0
        announce = True  # the first token says the prompt's length, as the in-process engine's does
        think_open = request.prompt is None and grammar is None and opens_reasoning(text)
        if think_open and not images:
            yield GeneratedToken(THINK_OPEN, prompt_tokens=len(tokens))  # the template opened the think block
            announce = False
        streams = self._streams
        if streams is None:
            raise EngineNotLoaded("no model is loaded")
        try:
            # The token stream goes over the lean loopback transport (`sse`), not httpx: its
            # per-event cost is taken from the server's own CPU at high concurrency.
            with streams.post("/completion", json.dumps(body).encode()) as response:
                if response.status != 200:
                    raise _server_error(response.status, response.read().decode("utf-8", "replace"))

                evaluated: list[int] = []  # the server's prompt length, image tokens included

                def tokens_of_line(line: bytes) -> Iterable[GeneratedToken]:
                    event = _event_of(line.decode("utf-8"))
                    if event is None:
                        return ()
                    if not evaluated and event.get("tokens_evaluated"):
                        evaluated.append(int(event["tokens_evaluated"]))
                    return tokens_of_event(event, request.logprobs, top)

                # Returning (cancelled) leaves the block, which closes the socket: the
                # server frees the slot.
                relayed = relay_served(response.lines(), tokens_of_line, cancelled,
                                       unfinished="llama-server ended the stream without a final event")
                if announce:
                    first = next(relayed, None)
                    if first is None:
                        return
                    # With images only the server knows the prompt's length: a think block
                    # the template opened is reported once the server has said it.
                    count = evaluated[0] if images and evaluated else len(tokens)
                    if think_open:
                        yield GeneratedToken(THINK_OPEN, prompt_tokens=count)
                        yield first
                    else:
                        yield replace(first, prompt_tokens=count)
                yield from relayed
        except TRANSPORT_ERRORS as exc:
            raise self._transport_failure(exc) from exc

    def _image_prompt(self, request: TextGenerationParams, images: list[ImageInput]) -> dict[str, Any]:
        if self._media_marker is None:
            raise ImagesNotServed("this model has no projector loaded: it does not see images")
        return image_prompt(self._tokenizer.server_prompt_text(request), images, self._media_marker)

    def _call(self, send):
        try:
            return send()
        except httpx.HTTPError as exc:
            raise self._transport_failure(exc) from exc

    def _transport_failure(self, exc: BaseException) -> EngineError:
        server = self._server
        if server is not None and not server.alive():
            return EngineBroken(f"llama-server (pid {server.pid}) died: {server.log_tail()[-500:]}")
        return EngineError(f"llama-server request failed: {type(exc).__name__}: {exc}")


def _with_port(launch: ServerLaunch, port: int) -> ServerLaunch:
    return replace(launch, port=port)


def _event_of(line: str) -> dict[str, Any] | None:
    """One SSE line -> its JSON payload (None for blank lines and comments). An `error:`
    line, or a payload holding `error`, raises the typed error it describes."""
    if line.startswith("data:"):
        payload = json.loads(line[5:].strip())
        if isinstance(payload, dict) and "error" in payload:
            raise _error_of(payload["error"])
        return payload
    if line.startswith("error:"):
        raise _error_of(json.loads(line[6:].strip()))
    return None


def _server_error(status: int, text: str) -> EngineError:
    try:
        payload = json.loads(text)
    except ValueError:
        return EngineError(f"llama-server answered {status}: {text[:500]}")
    return _error_of(payload.get("error", payload) if isinstance(payload, dict) else payload)


def _error_of(error: Any) -> EngineError:
    if isinstance(error, dict):
        if error.get("type") == "exceed_context_size_error":
            return PromptTooLong(int(error.get("n_prompt_tokens") or 0), int(error.get("n_ctx") or 0))
        message = str(error.get("message") or error)
        if error.get("type") == "invalid_request_error":
            return GrammarRejected(message) if "grammar" in message.lower() else _invalid(message)
        return EngineError(f"llama-server: {message}")
    return EngineError(f"llama-server: {error}")


def _invalid(message: str) -> EngineError:
    from skulk.worker.engines.served.launch import ServedRequestRejected

    return ServedRequestRejected(f"llama-server refused the request: {message}")


__all__ = [
    "CONNECT_TIMEOUT_S",
    "PORT_ATTEMPTS",
    "READ_TIMEOUT_S",
    "ImagesNotServed",
    "LlamaServerEngine",
    "ProjectorMissing",
    "projector_launch_path",
]
