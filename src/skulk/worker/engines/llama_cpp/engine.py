"""In-process llama.cpp engine: one GGUF model, one generation at a time.

It renders chat messages with the GGUF's own embedded chat template (or takes a raw prompt),
tokenizes, and decodes with llama-cpp-python's low-level `Llama.generate` token loop. It
deliberately avoids `create_completion` / `create_chat_completion`: their per-token Python
bookkeeping (logprob arrays, repeated detokenization of the whole tail, stop scanning over
bytes) costs more than a small model's forward pass. Stop strings, UTF-8 reassembly and
usage counting use the shared helpers in `engines.base`, so every engine streams alike.

Images (a card that sees, with its projector): the projector is opened with mtmd
(`llama_cpp.vision.Eyes`); each image's marker in the rendered prompt becomes stand-in
tokens keyed by the image's digest, so the prompt's length counts the image and the prefix
cache never reuses KV past an image that differs, and the image is evaluated with mtmd's
helper where it stands. A pooled instance does not see (refused by name).

A request whose `tool_choice` forces a call ("required", or one named function) is sampled
under a GBNF grammar (`skulk.shared.tool_grammar`) so that its output is a call the API
parses; every other request is sampled exactly as before, with no grammar.

This module never manages threads, queues or processes (the dispatcher and the runner do),
and it never reads cluster state: everything it needs arrives in the `ShardSpec`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from skulk.shared.prefix_cache import cold_budget_bytes
from skulk.shared.reasoning_switches import template_kwargs
from skulk.shared.sampling_defaults import DEFAULT_TEMPERATURE, DEFAULT_TOP_K, DEFAULT_TOP_P, LLAMA_CPP_DEFAULT_MIN_P
from skulk.shared.settings import setting
from skulk.shared.tool_grammar import SchemaNotSupported, request_grammar
from skulk.shared.types.cards import backend_engine
from skulk.shared.types.chunks import TopLogprob
from skulk.shared.types.common import FinishReason, Usage
from skulk.shared.types.kv_cache import DEFAULT_KV_CACHE_TYPE
from skulk.shared.types.stream_errors import StreamErrorType
from skulk.shared.types.tasks import TextGenerationParams
from skulk.worker.engines.base import (
    ChatTemplateMissing,
    EngineBusy,
    EngineError,
    EngineNotLoaded,
    GeneratedToken,
    ModelLoadFailed,
    PromptTooLong,
    ShardSpec,
    chat_message_dict,
)
from skulk.worker.engines.hugepages import this_process_weights_in_malloc
from skulk.worker.engines.llama_cpp.prefix import LlamaPrefixStore
from skulk.worker.engines.llama_cpp.vision import (
    Eyes,
    ImageFailed,
    ImagesNotSeen,
    ImageSpan,
    image_spans,
    image_tokens,
    place_images,
    reusable_prefix,
)
from skulk.worker.engines.logits import (
    GrammarRejected,
    InvalidTokens,
    ScoredToken,
    Scores,
    check_bias_ids,
    log_softmax_at,
    prompt_entries,
    with_prompt_logprobs,
)
from skulk.worker.engines.openmp import physical_cores
from skulk.worker.engines.projector import projector_launch_path
from skulk.worker.engines.prompt_pieces import (
    REASONING_OPEN,
    PromptCancelled,
    PromptOverContext,
    Segment,
    continued,
    opens_reasoning,
    prompt_pieces,
    render_segments,
    special_token_pattern,
    tokenize_pieces,
)
from skulk.worker.engines.token_loop import max_new_tokens, token_loop

log = logging.getLogger(__name__)

FLASH_ATTN_ENV = "SKULK_LLAMA_CPP_FLASH_ATTN"
"""Node-wide Flash Attention switch: '0' turns it off; anything else (or unset) leaves it on.
A card's `runtime.flash_attn` pin overrides it for that model."""

# llama.cpp's own sampling defaults, used when a request leaves a knob unset.
DEFAULT_MIN_P = LLAMA_CPP_DEFAULT_MIN_P

WARM_UP_PROMPT = b"Hello"
"""A few tokens through the whole graph: pages the weights in and builds the compute graph
before the first client pays for it."""

CHAT_TEMPLATE_KEY = "tokenizer.chat_template"

PROMPT_SCORE_BATCH = 64
"""Prompt positions scored per decode for `prompt_logprobs` (echo with logprobs): each asks
llama.cpp for a whole vocabulary row of logits, so the batch bounds that buffer (64 rows of a
150k vocabulary are 38 MB)."""

POOLING_NONE = 0
"""llama.cpp's LLAMA_POOLING_TYPE_NONE: the context yields one embedding per token (every
generative GGUF); other types pool inside llama.cpp and yield one per sequence."""


THINK_OPEN = REASONING_OPEN
"""The tag reasoning models open their reasoning with. The API separates it from the
answer; the engine only has to say when the chat template, not the model, wrote it
(`opens_reasoning`)."""


class EmbeddingFailed(EngineError):
    error_type = StreamErrorType.EMBEDDING_FAILED


class InvalidDimensions(EngineError):
    error_type = StreamErrorType.INVALID_REQUEST


class SpecialTextInCallerText(EngineError):
    """Caller text holding special-token text, in a prompt sent as text to a server that
    parses special tokens in all of it (a prompt with images)."""

    error_type = StreamErrorType.INVALID_REQUEST


def check_token_ids(tokens: Sequence[int], n_vocab: int, index: int) -> None:
    """`InvalidTokens` naming the first id of input `index` outside [0, n_vocab)."""
    for token in tokens:
        if not 0 <= token < n_vocab:
            raise InvalidTokens(f"input[{index}] holds token id {token}, outside this model's vocabulary "
                                f"(0..{n_vocab - 1})")


def logit_bias_processor(bias: dict[int, float], n_vocab: int) -> list[Callable[[Any, np.ndarray], np.ndarray]] | None:
    """llama-cpp-python logits processors adding `bias` (token id -> logit offset, as
    OpenAI's `logit_bias`), or None without a bias (the sampler chain stays native). Ids
    outside the vocabulary are refused: a bias that lands nowhere is a silent no-op."""
    if not bias:
        return None
    check_bias_ids(bias, n_vocab)
    ids = np.fromiter(bias.keys(), dtype=np.intp, count=len(bias))
    offsets = np.fromiter(bias.values(), dtype=np.float32, count=len(bias))

    def add_bias(_input_ids: Any, logits: np.ndarray) -> np.ndarray:
        # The custom sampler runs first in llama.cpp's chain, over every token in id order.
        logits[ids] += offsets
        return logits

    return [add_bias]


def normalise(vector: np.ndarray, dimensions: int | None = None) -> list[float]:
    """`vector` cut to its first `dimensions` (as OpenAI's `dimensions` does) and scaled to
    unit L2 length; a zero vector stays zero rather than becoming NaN."""
    if dimensions is not None:
        if dimensions > vector.shape[0]:
            raise InvalidDimensions(f"dimensions is {dimensions}, but this model's embeddings have {vector.shape[0]}")
        vector = vector[:dimensions]
    norm = float(np.linalg.norm(vector))
    return (vector / norm if norm > 0 else vector).tolist()


def control_tokens(llama_cpp: Any, vocab: Any) -> dict[str, int]:
    """Text -> id of the vocabulary's control tokens: the ones llama.cpp parses only when
    asked to parse special tokens ('<|eot_id|>', '<|start_header_id|>'). Only a chat
    template's own text is searched for them (see `prompt_pieces`)."""
    found: dict[str, int] = {}
    for token in range(llama_cpp.llama_vocab_n_tokens(vocab)):
        if llama_cpp.llama_vocab_get_attr(vocab, token) & llama_cpp.LLAMA_TOKEN_ATTR_CONTROL:
            text = (llama_cpp.llama_vocab_get_text(vocab, token) or b"").decode("utf-8", errors="replace")
            if text:
                found.setdefault(text, token)
    return found


def flash_attn_enabled(card_pin: bool | None, env: Mapping[str, str], kv_type: str = DEFAULT_KV_CACHE_TYPE) -> bool:
    """The card's explicit pin wins; otherwise a quantized KV cache turns it on (llama.cpp
    quantizes the V cache only with flash attention, and the placement's type is the more
    specific choice; a card pinned off never gets one: placement refuses it); otherwise the
    node setting; otherwise on."""
    if card_pin is not None:
        return card_pin
    return kv_type != DEFAULT_KV_CACHE_TYPE or setting(FLASH_ATTN_ENV, env) != "0"


def gpu_layers_for(backend_tag: str) -> int:
    """Offload every layer unless the placement chose the CPU build ('llama_cpp-cpu'); a
    CPU-only llama.cpp build ignores the request, so -1 is safe everywhere else."""
    compute = backend_tag.split("-", 1)[1] if "-" in backend_tag else None
    return 0 if compute == "cpu" else -1


def planned_gpu_layers(spec: ShardSpec) -> int:
    """n_gpu_layers for this shard: the capacity planner's count when it planned the shard
    on VRAM (layers that did not fit were shed to RAM), else `gpu_layers_for` its backend."""
    capacity = spec.instance.capacity
    if capacity is not None:
        shard = spec.shard
        planned = next((s for s in capacity.shards if s.rank == shard.rank and s.node_id == shard.node_id), None)
        if planned is not None and planned.device_kind == "vram" and planned.shortfall is None:
            return planned.gpu_layers
    return gpu_layers_for(spec.shard.backend)


class LlamaCppEngine:
    """`Engine` over llama_cpp.Llama. Width 1: llama.cpp's context is not re-entrant."""

    def __init__(self) -> None:
        self._llama: Any = None
        self._vocab: Any = None
        self._formatter: Any = None
        self._reasoning_switches: tuple[str, ...] = ()
        self._special_ids: dict[str, int] = {}
        self._special_pattern: re.Pattern[str] | None = None
        self._n_ctx = 0
        self._busy = threading.Lock()
        self._in_flight = 0
        self._spec: ShardSpec | None = None
        self._prefixes = LlamaPrefixStore(0)
        self._pool: Any = None
        """The PoolDriver when this engine drives a llama.cpp pool."""
        self._fatal_handler: Callable[[str, str], None] | None = None
        self._eyes: Eyes | None = None
        """The projector, opened with mtmd, when this engine sees images."""
        self._blind = "this model does not see images"
        """Why this engine refuses images, when it has no eyes."""
        self._tokenizer_only = False
        """Loaded for its prompt machinery only (llama-server's): images stay markers."""

    def set_fatal_handler(self, handler: Callable[[str, str], None]) -> None:
        """`handler(error_type, message)` runs (on any thread) when the engine can never
        serve again outside a generation (a pool lost a donor); it must not return. The
        runner sets it to end every open stream with the error and exit."""
        self._fatal_handler = handler

    def _fatal(self, error_type: str, message: str) -> None:
        if self._fatal_handler is not None:
            self._fatal_handler(error_type, message)
        log.critical("llama.cpp engine broken: %s", message)
        os._exit(4)  # never reached with a runner's handler; never leave a half-model serving

    # -- protocol -------------------------------------------------------------------------

    @property
    def concurrency(self) -> int:
        return 1

    @property
    def in_flight(self) -> int:
        return self._in_flight

    @property
    def context_tokens(self) -> int:
        """The loaded context size (0 before load)."""
        return self._n_ctx

    @property
    def llama(self) -> Any:
        """The underlying llama_cpp.Llama (for diagnostics and tests)."""
        return self._require_loaded()

    @property
    def prefixes(self) -> LlamaPrefixStore:
        """The cold prefix store (its `stats` say how much KV was re-used)."""
        return self._prefixes

    def load(self, spec: ShardSpec) -> None:
        import llama_cpp

        if backend_engine(spec.shard.backend) != "llama_cpp":
            raise ModelLoadFailed(f"shard backend {spec.shard.backend!r} is not a llama_cpp backend")
        if spec.shard.world_size != 1 and spec.shard.rank != 0:
            raise ModelLoadFailed("ranks 1..n of a llama.cpp pool are donors (PoolDonorEngine), not this engine")
        if not Path(spec.model_path).is_file():
            raise ModelLoadFailed(f"GGUF file not found: {spec.model_path}")
        placing: Any = contextlib.nullcontext()
        pooled: dict[str, Any] = {}
        # A pool's driver has no mtmd path over its donors' layers: it serves text only.
        projector = projector_launch_path(spec) if spec.shard.world_size == 1 else None
        if spec.shard.world_size > 1:
            # The driver of a pool: its model spans its own device plus one per donor.
            from skulk.worker.engines.llama_cpp.pool import PoolDriver

            self._pool = PoolDriver(spec, self._fatal)
            self._pool.connect()
            pooled, placing = self._pool.options(spec.card.num_layers)
        n_ctx = min(spec.instance.context_token_limit, spec.card.context_length)
        self._reasoning_switches = spec.card.reasoning.switches
        threads = spec.n_threads or physical_cores()
        kv_type = spec.shard.kv_cache_type
        flash_attn = flash_attn_enabled(spec.card.runtime.flash_attn, os.environ, kv_type)
        ggml_type = getattr(llama_cpp, f"GGML_TYPE_{kv_type.upper()}")
        options = dict(
            model_path=spec.model_path,
            n_threads=threads,
            n_threads_batch=threads,
            n_gpu_layers=planned_gpu_layers(spec),
            flash_attn=flash_attn,
            type_k=ggml_type,
            type_v=ggml_type,
            use_mmap=not this_process_weights_in_malloc(os.environ),  # weights on huge pages (see hugepages)
            logits_all=False,
            verbose=False,
        )
        options.update(pooled)
        with placing:
            llama = self._open(llama_cpp, n_ctx=n_ctx, **options)
            trained = llama_cpp.llama_model_n_ctx_train(llama.model)  # the GGUF's own trained context
            if 0 < trained < n_ctx:
                # The card over-states the context: never allocate (or promise) more than trained.
                log.info("%s: trained context %d < %d requested; reloading", spec.model_path, trained, n_ctx)
                llama.close()
                n_ctx = trained
                llama = self._open(llama_cpp, n_ctx=n_ctx, **options)
        self._see_through(spec, llama, projector, threads=threads, flash_attn=flash_attn)
        self._llama = llama
        self._vocab = llama_cpp.llama_model_get_vocab(llama.model)
        # llama.cpp pads its context (to 256 tokens); the instance's limit is still the
        # promise every rank keeps, so the engine enforces the smaller of the two.
        self._n_ctx = min(llama.n_ctx(), n_ctx)
        self._formatter = self._chat_formatter(llama)
        self._special_ids = control_tokens(llama_cpp, self._vocab)
        self._special_pattern = special_token_pattern(self._special_ids)
        self._spec = spec
        capacity = spec.instance.capacity
        planned = capacity.cold_budget_bytes if capacity is not None else None
        try:
            budget = cold_budget_bytes(planned, os.environ)
        except ValueError as exc:
            raise ModelLoadFailed(str(exc)) from exc
        self._prefixes = LlamaPrefixStore(budget)
        log.info(
            "loaded %s: n_ctx=%d threads=%d flash_attn=%s kv_cache=%s mmap=%s", spec.model_path, self._n_ctx,
            threads, options["flash_attn"], kv_type, options["use_mmap"],
        )

    def _see_through(self, spec: ShardSpec, llama: Any, projector: Path | None, *, threads: int,
                     flash_attn: bool) -> None:
        """Open the card's projector (eyes), or note why this engine refuses images."""
        if spec.shard.world_size > 1:
            if "vision" in spec.card.capabilities:
                self._blind = (f"{spec.card.model_id} is pooled over several nodes, and a pooled llama.cpp "
                               "instance does not see images")
            return
        if projector is None:
            return
        try:
            opened = Eyes.open(llama, str(projector), threads=threads, use_gpu=planned_gpu_layers(spec) != 0,
                               flash_attn=flash_attn)
        except Exception:
            llama.close()
            raise
        if isinstance(opened, str):
            self._blind = f"{spec.card.model_id} is served text only by the llama_cpp engine: {opened}"
            log.warning("%s", self._blind)
            return
        self._eyes = opened
        log.info("%s sees through projector %s", spec.card.model_id, projector)

    @property
    def sees(self) -> bool:
        """Whether this engine evaluates images (a projector is open)."""
        return self._eyes is not None

    def load_tokenizer(self, model_path: str, n_ctx: int, reasoning_switches: tuple[str, ...] = ()) -> None:
        """Only the GGUF's vocabulary and chat template (no weights): the prompt machinery
        (`prompt_and_tokens`) for an engine that generates elsewhere, so a llama-server
        sees exactly the tokens this engine would feed (caller text never parsed as special
        tokens), tokenized in linear time."""
        import llama_cpp

        llama = self._open(llama_cpp, model_path=model_path, vocab_only=True, verbose=False)
        self._tokenizer_only = True
        self._llama = llama
        self._vocab = llama_cpp.llama_model_get_vocab(llama.model)
        self._n_ctx = n_ctx
        self._reasoning_switches = reasoning_switches
        self._formatter = self._chat_formatter(llama)
        self._special_ids = control_tokens(llama_cpp, self._vocab)
        self._special_pattern = special_token_pattern(self._special_ids)

    def warm_up(self) -> None:
        llama = self._require_loaded()
        tokens = llama.tokenize(WARM_UP_PROMPT, add_bos=self._adds_bos(), special=False)
        generator = llama.generate(tokens, temp=0.0, reset=True)
        try:
            next(generator, None)
        finally:
            generator.close()
        llama.reset()

    def generate(self, request: TextGenerationParams, cancelled: threading.Event) -> Iterator[GeneratedToken]:
        llama = self._require_loaded()
        if not self._busy.acquire(blocking=False):
            raise EngineBusy("llama.cpp runs one generation at a time")
        try:
            self._in_flight = 1
            yield from self._generate(llama, request, cancelled)
        finally:
            self._in_flight = 0
            self._busy.release()

    def embed(
        self, inputs: Sequence[str] | Sequence[Sequence[int]], dimensions: int | None = None
    ) -> tuple[list[list[float]], int]:
        """One unit-length vector per input (mean of the last layer's per-token embeddings,
        or llama.cpp's own pooling where the GGUF declares one), and the tokens consumed.
        An input is text, or a list of token ids embedded as given (no BOS added), each
        checked against the vocabulary (`InvalidTokens`).

        It borrows the generation context: embeddings are switched on, each input decoded
        from position 0 with outputs for every token, then switched off and the KV cache
        cleared, so the next generation re-evaluates its prompt (no stale prefix reuse).
        Runs under the same lock as `generate`: the context is never shared."""
        llama = self._require_loaded()
        if not self._busy.acquire(blocking=False):
            raise EngineBusy("llama.cpp runs one request at a time")
        try:
            self._in_flight = 1
            token_lists = [self._embedding_tokens(llama, item, index) for index, item in enumerate(inputs)]
            vectors = [normalise(self._embed_tokens(llama, tokens), dimensions) for tokens in token_lists]
            return vectors, sum(len(tokens) for tokens in token_lists)
        finally:
            self._in_flight = 0
            self._busy.release()

    def echo(self, text: str) -> tuple[list[int], str]:
        """The echo workload (`skulk.shared.types.workloads`): `text` as this model's
        tokenizer reads it (no BOS added) and those tokens detokenized again. It reads the
        vocabulary only, never the context, so it needs no lock."""
        llama = self._require_loaded()
        tokens = list(llama.tokenize(text.encode("utf-8"), add_bos=False, special=False)) if text else []
        return tokens, llama.detokenize(tokens).decode("utf-8", errors="replace")

    def close(self) -> None:
        self._prefixes.clear()
        eyes, self._eyes = self._eyes, None
        if eyes is not None:
            eyes.close()  # mtmd holds the model: before it
        llama, self._llama = self._llama, None
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.close_pending()
        if llama is not None:
            llama.close()
        if pool is not None:
            pool.close()

    # -- prompt -------------------------------------------------------------------------

    def prompt_tokens(self, request: TextGenerationParams, cancelled: threading.Event | None = None) -> list[int]:
        """The exact tokens the model sees for `request`: the raw prompt, or the messages
        rendered with the GGUF's chat template. Special-token text the template wrote
        ('<|eot_id|>') becomes the special token; the same text in caller content stays
        text (see `prompt_pieces`). BOS is added once, only if the model wants one and the
        prompt does not already start with it (templates usually write it themselves).

        Cost is linear in the prompt's length; it stops early with `PromptTooLong` once the
        context is reached and with `PromptCancelled` once `cancelled` is set."""
        return self._prompt(request, cancelled)[1]

    def prompt_and_tokens(
        self, request: TextGenerationParams, cancelled: threading.Event | None = None
    ) -> tuple[str, list[int]]:
        """The rendered prompt text and its tokens (see `prompt_tokens`)."""
        return self._prompt(request, cancelled)

    def _prompt(self, request: TextGenerationParams, cancelled: threading.Event | None = None) -> tuple[str, list[int]]:
        """The rendered prompt text and its tokens."""
        text, tokens, _spans = self._prompt_with_images(request, cancelled)
        return text, tokens

    def _prompt_with_images(
        self, request: TextGenerationParams, cancelled: threading.Event | None = None
    ) -> tuple[str, list[int], list[ImageSpan]]:
        """The rendered prompt text, its tokens (each image's stand-ins included), and where
        each image stands in them."""
        llama = self._require_loaded()
        if request.prompt is not None:
            text, segments = request.prompt, [Segment(request.prompt, True)]
        else:
            text, segments = self._chat_segments(request)
        pieces = prompt_pieces(segments, self._special_pattern, self._special_ids)
        images = [image for message in request.messages for image in message.images] if request.prompt is None else []
        expansions: list[list[int]] = []
        if images and not self._tokenizer_only:
            if self._eyes is None:
                raise ImagesNotSeen(self._blind)
            expansions = [image_tokens(image.sha256, self._eyes.layout(image)) for image in images]
            pieces = place_images(pieces, expansions)
        bos = llama.token_bos()
        add_bos = self._adds_bos() and bos >= 0 and not (pieces and pieces[0] == bos)
        limit = self._n_ctx - int(add_bos)
        try:
            tokens = tokenize_pieces(pieces, self._encode_text, limit=limit, cancelled=cancelled)
        except PromptOverContext as over:
            raise PromptTooLong(over.tokens_so_far + int(add_bos), self._n_ctx) from None
        if add_bos:
            tokens.insert(0, bos)
        return text, tokens, image_spans(tokens, expansions, images) if expansions else []

    def server_prompt_text(self, request: TextGenerationParams) -> str:
        """The rendered prompt as text for a server that tokenizes it itself, parsing
        special-token text everywhere (llama-server's multimodal prompts): without the
        leading BOS text (the server adds BOS), and refused (`SpecialTextInCallerText`) when
        caller text holds special-token text, which the server would read as the token."""
        llama = self._require_loaded()
        if request.prompt is not None:
            text, segments = request.prompt, [Segment(request.prompt, False)]
        else:
            text, segments = self._chat_segments(request)
        caller = [Segment(segment.text, True) for segment in segments if not segment.trusted]
        if any(isinstance(piece, int) for piece in prompt_pieces(caller, self._special_pattern, self._special_ids)):
            raise SpecialTextInCallerText(
                "the request's text holds special-token text, which llama-server would read as the token "
                "in a prompt with images"
            )
        bos = llama.token_bos()
        bos_text = llama.detokenize([bos], special=True).decode("utf-8", errors="ignore") if bos >= 0 else ""
        if self._adds_bos() and bos_text and text.startswith(bos_text):
            text = text[len(bos_text):]
        return text

    def _encode_text(self, text: str) -> list[int]:
        """Tokens of plain text, special-token text included as text. Calls llama.cpp
        directly with a buffer sized to the text (a text never has more tokens than bytes),
        where llama-cpp-python's wrapper allocates a context-sized one per call."""
        import llama_cpp

        data = text.encode("utf-8")
        capacity = len(data) + 1
        buffer = (llama_cpp.llama_token * capacity)()
        count = llama_cpp.llama_tokenize(self._vocab, data, len(data), buffer, capacity, False, False)
        if count < 0:  # never expected; llama.cpp says how many it needs
            capacity = -count
            buffer = (llama_cpp.llama_token * capacity)()
            count = llama_cpp.llama_tokenize(self._vocab, data, len(data), buffer, capacity, False, False)
        return buffer[:count]

    def render_chat(self, request: TextGenerationParams) -> str:
        """The messages as the GGUF's chat template writes them."""
        messages, tools = self._chat_inputs(request)
        return self._render(messages, tools, self._switches_for(request))

    def _chat_segments(self, request: TextGenerationParams) -> tuple[str, list[Segment]]:
        messages, tools = self._chat_inputs(request)
        switches = self._switches_for(request)
        rendered, segments = render_segments(lambda m, t: self._render(m, t, switches), messages, tools)
        return continued(rendered, segments, request.continue_from)

    def _switches_for(self, request: TextGenerationParams) -> dict[str, Any]:
        """The template variables carrying the request's thinking / effort (the API already
        refused what the card's switches cannot do)."""
        return template_kwargs(self._reasoning_switches, request.thinking, request.reasoning_effort)

    def _chat_inputs(self, request: TextGenerationParams) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
        if self._formatter is None:
            raise ChatTemplateMissing(
                "this GGUF has no tokenizer.chat_template; send a raw `prompt` instead of `messages`"
            )
        tools = [
            {"type": "function", "function": {"name": t.name, "description": t.description, "parameters": t.parameters}}
            for t in request.tools
        ] or None
        return [chat_message_dict(m) for m in request.messages], tools

    def _render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                switches: dict[str, Any] | None = None) -> str:
        return self._formatter(messages=messages, tools=tools, **(switches or {})).prompt

    # -- internals ----------------------------------------------------------------------

    @staticmethod
    def _open(llama_cpp: Any, **kwargs: Any) -> Any:
        try:
            return llama_cpp.Llama(**kwargs)
        except Exception as exc:  # llama.cpp reports load failures as ValueError/RuntimeError
            raise ModelLoadFailed(f"llama.cpp could not load {kwargs.get('model_path')}: {exc}") from exc

    @staticmethod
    def _chat_formatter(llama: Any) -> Any:
        from llama_cpp.llama_chat_format import Jinja2ChatFormatter

        template = llama.metadata.get(CHAT_TEMPLATE_KEY)
        if not template:
            return None

        def token_text(token_id: int) -> str:
            if token_id < 0:
                return ""
            return llama.detokenize([token_id], special=True).decode("utf-8", errors="ignore")

        return Jinja2ChatFormatter(
            template=template,
            eos_token=token_text(llama.token_eos()),
            bos_token=token_text(llama.token_bos()),
            add_generation_prompt=True,
        )

    def _adds_bos(self) -> bool:
        import llama_cpp

        return bool(llama_cpp.llama_vocab_get_add_bos(self._vocab))

    def _embedding_tokens(self, llama: Any, item: str | Sequence[int], index: int) -> list[int]:
        if isinstance(item, str):
            tokens = llama.tokenize(item.encode("utf-8"), add_bos=self._adds_bos(), special=False)
        else:
            tokens = list(item)
            check_token_ids(tokens, llama.n_vocab(), index)
        if not tokens:
            raise EmbeddingFailed("an input produced no tokens; embeddings need non-empty text")
        if len(tokens) > self._n_ctx:
            raise PromptTooLong(len(tokens), self._n_ctx)
        return tokens

    def _embed_tokens(self, llama: Any, tokens: list[int]) -> np.ndarray:
        import llama_cpp

        ctx = llama._ctx.ctx
        n_embd = llama_cpp.llama_model_n_embd(llama.model)
        pooled = llama_cpp.llama_pooling_type(ctx) != POOLING_NONE
        if pooled and len(tokens) > llama.n_batch:
            raise PromptTooLong(len(tokens), llama.n_batch)  # a pooled sequence must fit one batch
        self._prefixes.save_hot(llama)  # the conversation in the context survives the embedding
        llama_cpp.llama_set_embeddings(ctx, True)
        try:
            self._clear_context(llama)
            total = np.zeros(n_embd, dtype=np.float64)
            for start in range(0, len(tokens), llama.n_batch):
                part = tokens[start : start + llama.n_batch]
                llama._batch.set_batch(batch=part, n_past=start, logits_all=True)
                llama._ctx.decode(llama._batch)
                if pooled:
                    continue
                rows = np.empty((len(part), n_embd), dtype=np.float32)
                for i in range(len(part)):
                    pointer = llama_cpp.llama_get_embeddings_ith(ctx, i)
                    if not pointer:
                        raise EmbeddingFailed("llama.cpp returned no embedding for a token")
                    rows[i] = np.ctypeslib.as_array(pointer, shape=(n_embd,))
                total += rows.sum(axis=0, dtype=np.float64)
            if pooled:
                pointer = llama_cpp.llama_get_embeddings_seq(ctx, 0)
                if not pointer:
                    raise EmbeddingFailed("llama.cpp returned no pooled embedding")
                return np.ctypeslib.as_array(pointer, shape=(n_embd,)).astype(np.float64)
            return total / len(tokens)
        finally:
            llama_cpp.llama_set_embeddings(ctx, False)
            self._clear_context(llama)

    @staticmethod
    def _clear_context(llama: Any) -> None:
        import llama_cpp

        memory = llama_cpp.llama_get_memory(llama._ctx.ctx)
        if memory is not None:
            llama_cpp.llama_memory_clear(memory, True)
        llama.reset()  # n_tokens = 0: the next generate finds no cached prefix to reuse

    def _token_maker(
        self, llama: Any, request: TextGenerationParams
    ) -> Callable[[str, int, FinishReason | None, Usage | None], GeneratedToken]:
        """How the loop builds each output token: plain `GeneratedToken` unless the request
        asked for logprobs, so the common path does no extra work per token."""
        if not request.logprobs:
            return GeneratedToken
        import llama_cpp

        ctx = llama._ctx.ctx
        n_vocab = llama.n_vocab()
        top = request.top_logprobs or 0

        def scored(text: str, token: int, finish: FinishReason | None = None, usage: Usage | None = None) -> ScoredToken:
            # The generator is suspended at its yield: the context still holds the logits
            # this token was sampled from (the next decode happens when we ask for more).
            logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, -1), shape=(n_vocab,))
            chosen, best = log_softmax_at(logits, token, top)
            tops = [
                TopLogprob(token=llama.detokenize([i]).decode("utf-8", errors="replace"), logprob=lp, token_id=i)
                for i, lp in best
            ]
            return ScoredToken(text, token, finish, usage, logprob=chosen, top_logprobs=tops)

        return scored

    def _grammar(self, llama: Any, request: TextGenerationParams) -> Any:
        """The llama.cpp grammar forcing a tool call or a response format, or None (the
        common case: sampling is unconstrained)."""
        try:
            text = request_grammar(request.tools, request.tool_choice, request.response_format)
        except SchemaNotSupported as exc:
            raise GrammarRejected(str(exc)) from exc
        if text is None:
            return None
        import llama_cpp
        from llama_cpp.llama_grammar import LlamaGrammar

        grammar = LlamaGrammar.from_string(text, verbose=False)
        # llama-cpp-python adds the grammar sampler without checking it parsed (a NULL
        # sampler crashes the chain), so parse it once here and fail the request instead.
        probe = llama_cpp.llama_sampler_init_grammar(
            self._vocab, grammar._grammar.encode("utf-8"), grammar._root.encode("utf-8"))
        if not probe:
            raise GrammarRejected("llama.cpp could not parse the request's grammar")
        llama_cpp.llama_sampler_free(probe)
        return grammar

    def _score_prompt(self, llama: Any, prompt: list[int], top: int, cancelled: threading.Event) -> list[Scores] | None:
        """Each prompt token's logprob given the tokens before it (`scores[j]` for
        `prompt[j + 1]`), or None when `cancelled` was set. The model is run over the prompt
        with logits for every position, `PROMPT_SCORE_BATCH` at a time (llama.cpp sizes its
        output buffer per batch, so this works on a context loaded without `logits_all`);
        the context is cleared before and after, so the generation that follows evaluates
        its prompt afresh (twice the prompt's work, paid only by requests that ask)."""
        import llama_cpp

        ctx = llama._ctx.ctx
        n_vocab = llama.n_vocab()
        scores: list[Scores] = []
        self._prefixes.save_hot(llama)  # the conversation held hot survives in the cold store
        self._clear_context(llama)
        try:
            for start in range(0, len(prompt), PROMPT_SCORE_BATCH):
                if cancelled.is_set():
                    return None
                part = prompt[start : start + PROMPT_SCORE_BATCH]
                llama._batch.set_batch(batch=part, n_past=start, logits_all=True)
                llama._ctx.decode(llama._batch)
                for i in range(len(part)):
                    if start + i + 1 >= len(prompt):
                        break
                    logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, i), shape=(n_vocab,))
                    scores.append(log_softmax_at(logits, prompt[start + i + 1], top))
        finally:
            self._clear_context(llama)
        return scores

    def _prefill(self, llama: Any, prompt: list[int], spans: Sequence[ImageSpan],
                 cancelled: threading.Event) -> int | None:
        """Evaluate all but the last prompt token, one batch at a time, checking `cancelled`
        between batches; None when it was set. `generate` then finds this prefix in the KV
        cache and evaluates only the last token, so a long prompt's evaluation (minutes on a
        CPU) stops within one batch of the client going away instead of running to the end.

        It starts from the longest prefix of the prompt already cached: the context's own
        or one restored from the cold store (`LlamaPrefixStore`), and returns how many
        prompt tokens that saved (the usage's `cached_tokens`).

        An image (`spans`) is evaluated whole, with mtmd, where it stands; a cached prefix
        ending inside one is cut back to its start."""
        head = prompt[:-1]
        cached = self._prefixes.prepare(llama, prompt)
        keep = reusable_prefix(cached, spans)
        if keep != cached:
            cached = self._prefixes.trim(llama, keep)
        images = {span.start: span for span in spans}
        starts = sorted(images)
        position = cached
        while position < len(head):
            if cancelled.is_set():
                return None
            span = images.get(position)
            if span is not None:
                self._evaluate_image(llama, span, prompt)
                position = span.end
                continue
            following = next((start for start in starts if start > position), len(head))
            stop = min(len(head), position + llama.n_batch, following)
            llama.eval(head[position:stop])
            position = stop
        return None if cancelled.is_set() else cached

    def _evaluate_image(self, llama: Any, span: ImageSpan, prompt: Sequence[int]) -> None:
        """Evaluate one image into the context at its span, and record its stand-in tokens
        there, so the prefix cache knows which image that KV holds."""
        eyes = self._eyes
        if eyes is None:
            raise ImagesNotSeen(self._blind)
        llama._ctx.kv_cache_seq_rm(-1, llama.n_tokens, -1)  # as `Llama.eval` does before decoding
        after = eyes.evaluate(llama, span.image, llama.n_tokens, llama.n_batch)
        if after != span.end:
            llama.reset()
            self._clear_context(llama)
            raise EngineError(f"mtmd evaluated an image to position {after}, where the prompt puts {span.end}")
        llama.input_ids[span.start : span.end] = prompt[span.start : span.end]
        llama.n_tokens = span.end
        llama._requires_eval = True  # no logits from an image: evaluate text before sampling

    def _token_text(self, token: int) -> str:
        return self._require_loaded().detokenize([token]).decode("utf-8", errors="replace")

    def _is_end_of_generation(self, token: int) -> bool:
        import llama_cpp

        return bool(llama_cpp.llama_vocab_is_eog(self._vocab, token))

    def _require_loaded(self) -> Any:
        if self._llama is None:
            raise EngineNotLoaded("no model is loaded")
        return self._llama

    def _generate(
        self, llama: Any, request: TextGenerationParams, cancelled: threading.Event
    ) -> Iterator[GeneratedToken]:
        try:
            text, prompt, spans = self._prompt_with_images(request, cancelled)
        except PromptCancelled:
            return  # the caller went away while the prompt was tokenized: nothing to say
        n_prompt = len(prompt)
        if spans and spans[-1].end >= n_prompt:
            raise ImageFailed("the prompt ends with an image: the chat template wrote nothing after it to "
                              "generate from")
        if spans and request.prompt_logprobs:
            raise ImagesNotSeen("prompt logprobs are not scored over images")
        n_ctx = min(self._n_ctx, request.context_tokens or self._n_ctx)
        if n_prompt >= n_ctx:
            raise PromptTooLong(n_prompt, n_ctx)
        max_new = max_new_tokens(request.max_tokens, n_prompt, n_ctx)

        temperature = DEFAULT_TEMPERATURE if request.temperature is None else request.temperature
        # LLAMA_DEFAULT_SEED asks llama.cpp for a fresh random seed; masks keep it uint32.
        llama.set_seed(0xFFFFFFFF if request.seed is None else request.seed & 0xFFFFFFFF)
        grammar = self._grammar(llama, request)
        scored_prompt = None
        if request.prompt_logprobs:
            scores = self._score_prompt(llama, prompt, request.top_logprobs or 0, cancelled)
            if scores is None:
                return  # cancelled while the prompt was scored
            added_bos = bool(prompt) and prompt[0] == llama.token_bos() and self._adds_bos()
            scored_prompt = prompt_entries(prompt, scores, self._token_text, skip_first=added_bos)
        cached = self._prefill(llama, prompt, spans, cancelled)
        if cached is None:
            return  # cancelled while the prompt was evaluated: nothing to say

        generator = llama.generate(
            prompt,
            temp=temperature,
            top_p=DEFAULT_TOP_P if request.top_p is None else request.top_p,
            top_k=DEFAULT_TOP_K if request.top_k is None else request.top_k,
            min_p=DEFAULT_MIN_P if request.min_p is None else request.min_p,
            repeat_penalty=1.0 if request.repeat_penalty is None else request.repeat_penalty,
            frequency_penalty=request.frequency_penalty or 0.0,
            presence_penalty=request.presence_penalty or 0.0,
            reset=True,  # keeps the longest common prefix of the KV cache, re-evaluates the rest
            grammar=grammar,
            logits_processor=logit_bias_processor(request.logit_bias, llama.n_vocab()),
        )
        announce_prompt = True
        try:
            if request.prompt is None and opens_reasoning(text) and grammar is None:
                # The template opened the think block itself (DeepSeek-R1 style), so the
                # model's output starts inside it: say so, as if the model had written it.
                # Not under a tool-call grammar: the output is then the call, never thought.
                yield GeneratedToken(THINK_OPEN, prompt_tokens=n_prompt)
                announce_prompt = False
            yield from token_loop(
                generator.__next__, lambda token: llama.detokenize([token]), self._is_end_of_generation,
                n_prompt=n_prompt, max_new=max_new, stop=request.stop, cancelled=cancelled, cached=cached,
                make=self._token_maker(llama, request), announce_prompt=announce_prompt,
                first=None if scored_prompt is None else lambda out: with_prompt_logprobs(out, scored_prompt),
            )
        finally:
            generator.close()


__all__ = [
    "DEFAULT_MIN_P",
    "DEFAULT_TEMPERATURE",
    "DEFAULT_TOP_K",
    "DEFAULT_TOP_P",
    "FLASH_ATTN_ENV",
    "POOLING_NONE",
    "THINK_OPEN",
    "EmbeddingFailed",
    "GrammarRejected",
    "InvalidDimensions",
    "InvalidTokens",
    "LlamaCppEngine",
    "ScoredToken",
    "SpecialTextInCallerText",
    "check_token_ids",
    "flash_attn_enabled",
    "gpu_layers_for",
    "log_softmax_at",
    "logit_bias_processor",
    "normalise",
    "opens_reasoning",
    "planned_gpu_layers",
]
