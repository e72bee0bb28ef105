"""Pure decisions for a served llama-server: how many slots, which command line, what
request body, and which tokens a stream event carries.

Kept apart from the process and HTTP shell so every rule is a table test: a slot setting
that is not a positive integer within bounds is refused (`InvalidSlotCount`), never
clamped; a request field the server cannot honour is refused, never dropped. The slot count itself
is a placement fact (`skulk.shared.slots`): the runner launches with the assignment's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from skulk.shared.slots import MAX_SLOTS, SLOT_SETTING_ENV
from skulk.shared.types.chunks import TopLogprob
from skulk.shared.types.common import FinishReason, Usage
from skulk.shared.types.media import IMAGE_MARKER, ImageInput
from skulk.shared.types.stream_errors import StreamErrorType
from skulk.shared.types.tasks import TextGenerationParams
from skulk.worker.engines.base import EngineError, GeneratedToken, ModelLoadFailed, usage_of
from skulk.worker.engines.llama_cpp.engine import (
    DEFAULT_MIN_P,
    DEFAULT_TEMPERATURE,
    DEFAULT_TOP_K,
    DEFAULT_TOP_P,
    ScoredToken,
)
from skulk.worker.engines.llama_cpp.vision import STB_DECODED_TYPES, rgb_pixels

MAX_TOP_LOGPROBS = 20
"""OpenAI's own bound on top_logprobs; llama-server's n_probs is capped the same way."""

HOST = "127.0.0.1"
"""The server listens on loopback only: the runner is its one client."""

STRIPPED_ENV_PREFIX = "LLAMA_ARG_"
"""llama-server reads any LLAMA_ARG_* variable as a flag; the runner's own environment must
never change how the server it launches behaves, so these never reach it."""


class InvalidSlotCount(ModelLoadFailed):
    error_type = StreamErrorType.INVALID_SLOT_COUNT


class ServedRequestRejected(EngineError):
    """A request field this served engine cannot honour."""

    error_type = StreamErrorType.INVALID_REQUEST


def assigned_slots(engine: str, slots: int) -> int:
    """The slot count placement stamped on the shard, checked against the engine's bound
    (a hand-made or foreign assignment could exceed it): refused, never clamped."""
    bound = MAX_SLOTS[engine]
    if not 1 <= slots <= bound:
        raise InvalidSlotCount(
            f"the shard assignment asks {engine} for {slots} slots; {SLOT_SETTING_ENV[engine]} allows 1..{bound}"
        )
    return slots


@dataclass(frozen=True)
class ServerLaunch:
    """Everything the command line says."""

    binary: Path
    model_path: Path
    port: int
    slots: int
    context_per_slot: int
    threads: int
    gpu_layers: int
    flash_attn: bool
    cache_ram_mib: int = 0
    """llama-server's host-RAM prompt cache (`--cache-ram`): the cold KV budget
    (`prefix_cache.cold_budget_bytes`), so conversations evicted from a slot come back from
    RAM instead of being re-evaluated; 0 turns it off."""
    kv_cache_type: str = "f16"
    """The KV cache's element type (`--cache-type-k/-v`), as placement admitted it."""
    spec_type: str | None = None
    """llama-server's `--spec-type` (the card's speculative method,
    `skulk.shared.types.speculative`); None: no speculation."""
    draft_model_path: Path | None = None
    """The draft GGUF (`--model-draft`) for draft speculation: it runs on the target's threads
    and device and keeps its KV cache in the target's element type, as admitted."""

    projector_path: Path | None = None
    """The multimodal projector (`--mmproj`) of a card that sees images: the server then
    takes `multimodal_data` with a prompt string (`image_prompt_body`)."""

    def _draft_args(self) -> tuple[str, ...]:
        if self.draft_model_path is None:
            return ()
        return ("--model-draft", str(self.draft_model_path), "--threads-draft", str(self.threads),
                "--n-gpu-layers-draft", str(self.gpu_layers),
                "--cache-type-k-draft", self.kv_cache_type, "--cache-type-v-draft", self.kv_cache_type)

    def argv(self) -> list[str]:
        return [
            str(self.binary),
            "--model", str(self.model_path),
            "--host", HOST,
            "--port", str(self.port),
            "--parallel", str(self.slots),
            # Each slot owns context_per_slot tokens of one KV cache (not unified): a long
            # request can never starve the others of cache.
            "--ctx-size", str(self.context_per_slot * self.slots),
            "--no-kv-unified",
            "--cont-batching",
            "--threads", str(self.threads),
            "--n-gpu-layers", str(self.gpu_layers),
            "--flash-attn", "on" if self.flash_attn else "off",
            # Skulk's planner sized this instance; the server must not resize it behind us.
            "--fit", "off",
            "--jinja",
            "--no-webui",
            # The host-RAM prompt cache is exactly the cold budget, never llama-server's own
            # default (8 GiB): the memory the node admitted is the memory used.
            "--cache-ram", str(self.cache_ram_mib),
            "--cache-type-k", self.kv_cache_type,
            "--cache-type-v", self.kv_cache_type,
            *(("--spec-type", self.spec_type) if self.spec_type is not None else ()),
            *self._draft_args(),
            *(("--mmproj", str(self.projector_path)) if self.projector_path is not None else ()),
        ]


def server_env(env: Mapping[str, str]) -> dict[str, str]:
    return {key: value for key, value in env.items() if not key.startswith(STRIPPED_ENV_PREFIX)}


def completion_body(
    request: TextGenerationParams, prompt: str | list[int] | dict[str, Any], grammar: str | None,
    room_tokens: int | None = None,
) -> dict[str, Any]:
    """The /completion body for one request: the prompt as token ids (or text, or a
    multimodal prompt, `image_prompt`), sampling,
    penalties, logit bias and grammar. `room_tokens` bounds the output to what is left of the
    request's context (without it and without max_tokens the server decodes until its slot's
    context is full and reports that as 'limit')."""
    if request.top_logprobs is not None and request.top_logprobs > MAX_TOP_LOGPROBS:
        raise ServedRequestRejected(f"top_logprobs is {request.top_logprobs}; at most {MAX_TOP_LOGPROBS}")
    wanted = request.max_tokens if request.max_tokens is not None else -1
    if room_tokens is not None:
        wanted = room_tokens if wanted < 0 else min(wanted, room_tokens)
    body: dict[str, Any] = {
        "prompt": prompt,
        "stream": True,
        "n_predict": wanted,
        "temperature": DEFAULT_TEMPERATURE if request.temperature is None else request.temperature,
        "top_p": DEFAULT_TOP_P if request.top_p is None else request.top_p,
        "top_k": DEFAULT_TOP_K if request.top_k is None else request.top_k,
        "min_p": DEFAULT_MIN_P if request.min_p is None else request.min_p,
        "repeat_penalty": 1.0 if request.repeat_penalty is None else request.repeat_penalty,
        "frequency_penalty": request.frequency_penalty or 0.0,
        "presence_penalty": request.presence_penalty or 0.0,
        "seed": -1 if request.seed is None else request.seed & 0xFFFFFFFF,
        "stop": list(request.stop),
        "cache_prompt": True,
        "return_tokens": True,
    }
    if request.logit_bias:
        body["logit_bias"] = [[int(token), float(bias)] for token, bias in sorted(request.logit_bias.items())]
    if request.logprobs:
        # At least one: the chosen token's own logprob rides in the same list.
        body["n_probs"] = max(1, request.top_logprobs or 0)
    if grammar is not None:
        body["grammar"] = grammar
    return body


def image_prompt(text: str, images: Sequence[ImageInput], media_marker: str) -> dict[str, Any]:
    """The /completion `prompt` for a rendered chat with images: the text with each
    `IMAGE_MARKER` replaced by the server's media marker (random per server process, read
    from its /props), and the images' bytes, base64, in the same order (llama-server's
    `multimodal_data`). The counts must agree: the API put one marker per image."""
    markers = text.count(IMAGE_MARKER)
    if markers != len(images):
        raise ServedRequestRejected(f"the prompt has {markers} image markers for {len(images)} images")
    return {"prompt_string": text.replace(IMAGE_MARKER, media_marker),
            "multimodal_data": [server_readable_b64(image) for image in images]}


def server_readable_b64(image: ImageInput) -> str:
    """The image as llama-server can read it, base64: as sent for the types its decoder
    (stb_image) reads; any other type the API accepts (WebP) re-encoded as PNG with Pillow
    first (the server answers "Failed to load image" otherwise). A file Pillow cannot read
    either is the request's typed failure."""
    if image.media_type in STB_DECODED_TYPES:
        return image.data_b64
    width, height, pixels = rgb_pixels(image.data, image.media_type)
    import base64
    import io

    from PIL import Image

    out = io.BytesIO()
    Image.frombytes("RGB", (width, height), pixels).save(out, "PNG")
    return base64.b64encode(out.getvalue()).decode("ascii")


FINISH_OF_STOP_TYPE: Mapping[str, FinishReason] = {"eos": "stop", "word": "stop", "limit": "length"}
"""llama-server's stop_type -> the finish reason clients see."""


def tokens_of_event(event: Mapping[str, Any], want_logprobs: bool, top: int) -> list[GeneratedToken]:
    """The tokens one SSE event of /completion carries. A partial event holds the newly
    releasable text of one (or, with stop-string hold-back, several) sampled tokens; the
    final event (`stop: true`) carries the last text, the stop type and the counts."""
    text = event.get("content") or ""
    token_ids: Sequence[int] = event.get("tokens") or ()
    token_id = token_ids[-1] if token_ids else None
    finish: FinishReason | None = None
    usage: Usage | None = None
    if event.get("stop"):
        finish = FINISH_OF_STOP_TYPE.get(str(event.get("stop_type")), "stop")
        timings = event.get("timings") or {}
        usage = usage_of(int(event.get("tokens_evaluated") or 0), int(event.get("tokens_predicted") or 0),
                         max(0, int(timings.get("cache_n") or 0)))
        drafted = max(0, int(timings.get("draft_n") or 0))
        if drafted:  # a speculating server says what its drafter proposed and what held
            usage = usage.model_copy(update={"drafted_tokens": drafted, "accepted_draft_tokens": min(
                drafted, max(0, int(timings.get("draft_n_accepted") or 0)))})
    probs = event.get("completion_probabilities") or []
    if want_logprobs and probs:
        out: list[GeneratedToken] = []
        for index, prob in enumerate(probs):
            last = index == len(probs) - 1
            tops = [
                TopLogprob(token=alt.get("token", ""), logprob=float(alt["logprob"]), token_id=alt.get("id"))
                for alt in (prob.get("top_logprobs") or [])[:top]
                if "logprob" in alt
            ]
            out.append(ScoredToken(
                text if last else "", prob.get("id"), finish if last else None, usage if last else None,
                logprob=float(prob["logprob"]) if "logprob" in prob else None, top_logprobs=tops,
            ))
        return out  # the event's text rides on its last scored token
    if not text and finish is None:
        return []
    matched = str(event.get("stopping_word") or "") if event.get("stop_type") == "word" else ""
    return [GeneratedToken(text, token_id, finish, usage, stop_sequence=matched or None)]


__all__ = [
    "FINISH_OF_STOP_TYPE",
    "HOST",
    "MAX_TOP_LOGPROBS",
    "InvalidSlotCount",
    "ServedRequestRejected",
    "ServerLaunch",
    "assigned_slots",
    "completion_body",
    "image_prompt",
    "server_env",
    "tokens_of_event",
]
