"""In-process MLX engine: one rank of an mlx-lm model, alone or in a pipeline/tensor group.

Every rank runs the same decode loop, step for step, so the group's collectives always line
up. Rank 0 is the leader: it alone renders prompts, talks to the dispatcher and streams to
the client. Before each collective step it broadcasts a fixed-size `Header` (an all_sum in
which only rank 0 contributes) saying what comes next: BEGIN a request (sampling params and
seed), STEP over n tokens (and whether to sample), END the request, or SHUTDOWN. The other
ranks are followers: a thread that waits for the next header and runs exactly that step.

One step, per mode:
- single rank: embed, all layers, logits, sample. No communication.
- pipeline: rank 0 embeds; each rank runs its layer range, evaluates its output (under the
  eval watchdog) and sends it to the next rank; the last rank computes logits, samples, and
  sends the token back to rank 0 (its ring neighbour). Prompt ids never leave rank 0.
- tensor: rank 0 also broadcasts the step's token ids; every rank embeds and runs all layers
  with sharded projections (two all_sums per layer), which leaves identical hidden states on
  every rank; rank 0 alone computes logits and samples, and its token reaches the followers
  as the next step's input.

Rank 0 decides everything that depends on the client (stop strings, cancellation, max
tokens) and tells the followers with the next header, so they never need the tokenizer.
A collective that raises mid-request leaves the ranks out of step; there is no safe way
back, so the rank exits and the instance is re-placed. On rank 0 the failure first ends the
request with `GroupBroken` naming the rank and node it lost (a peer that dies closes its ring
socket, and MLX raises within seconds), so the client's stream says which node went away
instead of "runner exited"; the runner then exits (`EngineBroken`). Followers have no client
and exit at once (`EXIT_GROUP_WEDGED`), as does any rank whose guarded evaluation outlives
the eval watchdog (a peer that went silent without closing its socket).

A request that asks for logprobs, logit bias, penalties or a grammar (structured output, a
forced tool call) is sampled by a `mlx_sampling.TokenChooser` on rank 0, where the logits
are computed on one rank and in a tensor group; a pipeline group refuses it (its last rank
samples). A model family without a layer adapter (`mlx_family`) runs whole on one rank.

This module never manages the runner's threads or queues beyond its own follower thread, and
never reads cluster state: everything arrives in the `ShardSpec`.
"""

from __future__ import annotations

import logging
import os
import queue
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import fields
from functools import partial
from pathlib import Path
from typing import Any, cast

from skulk.shared.kv_shape import config_kv_shape, value_dim
from skulk.shared.prefix_cache import cold_budget_bytes
from skulk.shared.types.cards import backend_engine
from skulk.shared.types.chunks import TopLogprob
from skulk.shared.types.ids import ModelId
from skulk.shared.types.stream_errors import StreamErrorType
from skulk.shared.types.tasks import TextGenerationParams
from skulk.worker.engines.base import (
    EngineBroken,
    EngineBusy,
    EngineError,
    EngineNotLoaded,
    GeneratedToken,
    ModelLoadFailed,
    PromptTooLong,
    ShardSpec,
)
from skulk.worker.engines.logits import GrammarMatcher, ScoredToken, llguidance_tokenizer
from skulk.worker.engines.mlx.batch import BatchLoop, BatchSequence, batch_width, batchable
from skulk.worker.engines.mlx.draft_model import DraftModel
from skulk.worker.engines.mlx.family import adapter_for, family_of
from skulk.worker.engines.mlx.group import (
    EVAL_TIMEOUT_ENV,
    EVAL_TIMEOUT_S,
    EXIT_GROUP_WEDGED,
    GROUP_CONNECT_DEADLINE_ENV,
    GROUP_CONNECT_DEADLINE_S,
    HEADER_LEN,
    OP_BEGIN,
    OP_END,
    OP_SHUTDOWN,
    OP_STEP,
    EvalWatchdog,
    Header,
    form_group,
    ring_addresses,
    seconds_from_env,
)
from skulk.worker.engines.mlx.kv_quant import KvQuantization, kv_quantization, quantized_cache
from skulk.worker.engines.mlx.pipeline import (
    Stage,
    build_stage,
    embed_tokens,
    forward_layers,
    last_logits,
    stage_role,
    whole_model_logits,
    whole_model_stage,
)
from skulk.worker.engines.mlx.prefix import MlxPrefixStore, reusable_in_batch
from skulk.worker.engines.mlx.sampling import (
    Sampler,
    SamplingParams,
    TokenChooser,
    resolve_sampling,
    shaping_of,
)
from skulk.worker.engines.mlx.speculate import (
    Speculation,
    prompt_lookup,
    speculating,
    trim,
    verify,
    with_draft_counts,
)
from skulk.worker.engines.mlx.tensor import shard_layers
from skulk.worker.engines.mlx.text import prompt_and_tokens, special_tokens, token_bytes_table
from skulk.worker.engines.prompt_pieces import REASONING_OPEN, PromptCancelled, PromptOverContext, opens_reasoning
from skulk.worker.engines.token_loop import max_new_tokens, token_loop

log = logging.getLogger(__name__)

PREFILL_CHUNK_TOKENS = 512
"""Prompt tokens per prefill step: bounds the activations one step holds and sends."""

WARM_UP_PROMPT = "Hello"
WARM_UP_TOKENS = 2
"""A couple of tokens through every rank: pages weights in, and proves the whole group can
run a request before any rank reports Ready."""

LEADER_WARM_UP_DEADLINE_S = 900.0
"""How long a follower waits, after the ring formed, for rank 0's warm-up request: rank 0
loads its own shard in the meantime, which for a large model from a cold disk takes minutes.
Past it the follower exits (`EXIT_GROUP_WEDGED`) rather than sit half-ready forever."""

SHUTDOWN_BROADCAST_TIMEOUT_S = 5.0
"""How long rank 0's close waits to tell followers to stop (they may already be gone)."""


class GroupBroken(EngineBroken):
    """The group lost a rank (or fell out of step): this rank can never run a step again."""

    error_type = StreamErrorType.GROUP_BROKEN


METAL_FAST_SYNCH_ENV = "MLX_METAL_FAST_SYNCH"
"""MLX's switch for Metal's fast CPU-GPU synchronisation (off unless set to 1)."""


def metal_fast_synch_env(pin: bool | None) -> str | None:
    """The value a card's `runtime.metal_fast_synch` pin gives MLX_METAL_FAST_SYNCH in its
    runner's process ("1" on, "0" off), or None to leave the node's environment as it is.
    One runner serves one model, so setting it in the runner's process scopes it to the card."""
    if pin is None:
        return None
    return "1" if pin else "0"


class MlxEngine:
    """`Engine` over an mlx-lm model. A group runs at width 1 (one request at a time drives
    every rank in lockstep); a single rank batches by default (`SKULK_MLX_BATCH_WIDTH`, see
    `mlx.batch`), unless the model's KV cache cannot join a batch."""

    def __init__(self) -> None:
        self._stage: Stage | None = None
        self._tokenizer: Any = None
        self._token_bytes: list[bytes] = []
        self._specials: dict[str, int] = {}
        self._eos: frozenset[int] = frozenset()
        self._group: Any = None
        self._watchdog: EvalWatchdog | None = None
        self._hidden_size = 0
        self._activation_dtype: Any = None
        self._n_ctx = 0
        self._model_id = ModelId("")
        self._busy = threading.Lock()
        self._in_flight = 0
        self._cache: list[Any] = []
        self._sampler: Sampler | None = None
        self._chooser: TokenChooser | None = None
        """Rank 0's shaped sampler for the request in flight (lockstep path), if it asked
        for logprobs, bias, penalties or a grammar."""
        self._vocab_size = 0
        self._grammar_tokenizer: Any = None
        self._follower: threading.Thread | None = None
        self._closed = False
        self._width = 1
        self._batch_model: Any = None
        self._batch: BatchLoop | None = None
        self._batch_cache: Callable[[], list[Any]] | None = None
        """A fresh cache for a sequence joining the batch (the placement's KV cache type)."""
        self._count_lock = threading.Lock()
        self._rank_nodes: list[str] = []
        """Node id of each rank, to name the node a broken collective lost."""
        self._my_rank = 0
        self._broken: GroupBroken | None = None
        self._speculative = False
        """Speculation (`runtime.speculative` "ngram" or "draft"): one whole-model rank, one
        request at a time (`mlx.speculate`)."""
        self._draft: DraftModel | None = None
        """The draft model of a card that drafts with one (`mlx.draft_model`)."""
        self._prefixes: MlxPrefixStore | None = None
        """The prefix cache of a single rank (None in a group, or in a batch whose model's
        KV cache is not plain `KVCache` layers)."""
        self.bytes_sent = 0
        """Bytes of step traffic this rank has sent, for benchmarks: pipeline activations and
        tokens as counted, tensor all_sums as the ring moves them (control headers excluded)."""

    # -- protocol -------------------------------------------------------------------------

    @property
    def concurrency(self) -> int:
        return self._width

    @property
    def in_flight(self) -> int:
        return self._in_flight

    @property
    def context_tokens(self) -> int:
        return self._n_ctx

    @property
    def prefixes(self) -> MlxPrefixStore | None:
        """The prefix cache (its `stats` say how much KV was re-used); None in a group."""
        return self._prefixes

    @property
    def rank(self) -> int:
        return self._require_loaded().role.rank

    @property
    def world(self) -> int:
        return self._require_loaded().role.world

    def load(self, spec: ShardSpec) -> None:
        # Before anything touches Metal: MLX reads its FAST_SYNCH switch once, on first use.
        pinned = metal_fast_synch_env(spec.card.runtime.metal_fast_synch)
        if pinned is not None:
            os.environ[METAL_FAST_SYNCH_ENV] = pinned
        import mlx.core as mx
        from mlx_lm.utils import load_config, load_model, load_tokenizer

        shard = spec.shard
        if backend_engine(shard.backend) != "mlx":
            raise ModelLoadFailed(f"shard backend {shard.backend!r} is not an mlx backend")
        path = Path(spec.model_path)
        if not (path / "config.json").is_file():
            raise ModelLoadFailed(f"no MLX/HF model directory at {spec.model_path}")
        config = load_config(path)
        # Multimodal configs keep the language model's shape in `text_config` (as cards read it).
        text = {**config, **config["text_config"]} if isinstance(config.get("text_config"), dict) else config
        role = stage_role(shard, spec.instance.sharding, int(text["num_hidden_layers"]))
        # A family with a layer adapter runs as stages (any world); any other family mlx-lm
        # loads runs whole on one rank (placement spans nodes only for adapted families).
        family = family_of(str(config.get("model_type"))) if role.world > 1 else adapter_for(
            str(config.get("model_type")))
        self._rank_nodes = [str(s.node_id) for s in spec.instance.shards]
        self._my_rank = role.rank
        if role.tensor and family is not None and family.tensor is None:
            raise ModelLoadFailed(f"model_type {config.get('model_type')!r} has no tensor-parallel plan")
        if role.world > 1:
            # The group first: a ring that cannot form fails in seconds, before the weights load.
            deadline = seconds_from_env(os.environ, GROUP_CONNECT_DEADLINE_ENV, GROUP_CONNECT_DEADLINE_S)
            self._group = form_group(ring_addresses(spec.instance), role.rank, deadline, tag=str(spec.instance.instance_id))
            self._watchdog = EvalWatchdog(seconds_from_env(os.environ, EVAL_TIMEOUT_ENV, EVAL_TIMEOUT_S))
        try:
            model, _ = load_model(path, lazy=True)
        except Exception as exc:
            raise ModelLoadFailed(f"mlx-lm could not load {path}: {exc}") from exc
        kv_shape = config_kv_shape(text, int(text["num_attention_heads"]), int(text["hidden_size"]))
        kv = kv_quantization(shard.kv_cache_type, (kv_shape.head_dim, value_dim(kv_shape.head_dim, kv_shape.value_head_dim)))
        if family is None:
            stage = whole_model_stage(model, role)
        else:
            parts = family.parts(model)
            if role.tensor:
                assert family.tensor is not None
                shard_layers(parts.layers, family.tensor, self._group, config)
            stage = build_stage(parts, role)
            del parts
        stage.kv = kv
        if kv is not None:
            stage.make_cache()  # a cache layer mlx-lm cannot quantize fails the load, not a request
        make_cache: Callable[[], list[Any]] | None = stage.make_cache
        self._speculative = speculating(spec.card.runtime.speculative, role.world, stage.make_cache)
        if self._speculative and spec.card.runtime.speculative == "draft":
            self._draft = DraftModel.load(spec.draft_model_path, int(text.get("vocab_size") or 0),
                                          PREFILL_CHUNK_TOKENS)
        if role.world == 1:
            # A speculating model steps one request at a time: mlx-lm's batch decodes one
            # token per sequence per step.
            self._width = 1 if self._speculative else batch_width(os.environ)
            # The batch generator runs the whole mlx-lm model (the stage's arrays) on that
            # model's own cache types (quantized as the placement says, `mlx.kv_quant`), so
            # those decide whether it batches and reuses prefixes.
            batch_cache = partial(_quantized_prompt_cache, model, kv)
            if self._width > 1 and not batchable(batch_cache()):
                log.info("%s: its KV cache cannot join an mlx-lm batch; serving one request at a time", path)
                self._width = 1
            if self._width > 1:
                self._batch_model = model
                self._batch_cache = batch_cache
                make_cache = batch_cache if reusable_in_batch(batch_cache()) else None
        del model  # unreferenced (lazy) weights of other ranks' layers are never read
        mx.eval(stage.parameters())
        self._stage = stage
        self._hidden_size = int(text["hidden_size"])
        self._vocab_size = int(text.get("vocab_size") or 0)
        self._activation_dtype = _activation_dtype(stage)
        self._n_ctx = min(spec.instance.context_token_limit, spec.card.context_length)
        self._model_id = ModelId(spec.card.model_id)
        self._reasoning_switches: tuple[str, ...] = spec.card.reasoning.switches
        if role.world == 1 and make_cache is not None:
            capacity = spec.instance.capacity
            planned = capacity.cold_budget_bytes if capacity is not None else None
            try:
                budget = cold_budget_bytes(planned, os.environ)
            except ValueError as exc:
                raise ModelLoadFailed(str(exc)) from exc
            self._prefixes = MlxPrefixStore(make_cache, budget)
        if role.rank == 0:  # followers never see text
            self._tokenizer = load_tokenizer(path)
            self._token_bytes = token_bytes_table(self._tokenizer)
            self._specials = special_tokens(self._tokenizer)
            self._eos = frozenset(int(t) for t in (self._tokenizer.eos_token_ids or ()))
        log.info(
            "loaded %s rank %d/%d layers [%d, %d) %s n_ctx=%d kv_cache=%s%s%s",
            path, role.rank, role.world, role.start_layer, role.end_layer,
            "tensor" if role.tensor else "pipeline", self._n_ctx, shard.kv_cache_type,
            f" ({kv.bits}-bit, groups of {kv.group_size})" if kv is not None else "",
            "" if not self._speculative else f", speculation draft (draft {spec.draft_model_path})"
            if self._draft is not None else ", speculation ngram (prompt lookup)",
        )

    def warm_up(self) -> None:
        stage = self._require_loaded()
        if self._batch_model is not None and self._batch is None:
            self._batch = BatchLoop(self._batch_model, self._width, prefixes=self._prefixes,
                                    prefill_step_tokens=PREFILL_CHUNK_TOKENS, make_cache=self._batch_cache)
        if stage.role.rank == 0:
            request = TextGenerationParams(
                model_id=self._model_id, prompt=WARM_UP_PROMPT, max_tokens=WARM_UP_TOKENS, temperature=0.0
            )
            for _ in self.generate(request, threading.Event()):
                pass
            return
        # A follower serves exactly the leader's warm-up request, then keeps following.
        while self._follow_one(begin_timeout_s=LEADER_WARM_UP_DEADLINE_S) != OP_END:
            pass
        self._follower = threading.Thread(target=self._follow_forever, name="mlx-follower", daemon=True)
        self._follower.start()

    def generate(self, request: TextGenerationParams, cancelled: threading.Event) -> Iterator[GeneratedToken]:
        stage = self._require_loaded()
        if stage.role.rank != 0:
            raise EngineError(f"rank {stage.role.rank} follows rank 0; send requests to rank 0")
        if self._batch is not None:
            yield from self._batched(request, cancelled)
            return
        if not self._busy.acquire(blocking=False):
            raise EngineBusy("the MLX engine runs one generation at a time")
        try:
            self._in_flight = 1
            yield from self._lead(request, cancelled)
        finally:
            self._in_flight = 0
            self._busy.release()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        stage = self._stage
        if stage is not None and stage.role.world > 1 and stage.role.rank == 0:
            self._tell_followers_to_stop()
        if self._watchdog is not None:
            self._watchdog.close()
        if self._batch is not None:
            self._batch.close()
        if self._prefixes is not None:
            self._prefixes.clear()
        if self._draft is not None:
            self._draft.close()
            self._draft = None
        self._stage = None

    # -- the leader (rank 0) --------------------------------------------------------------

    def prompt_tokens(self, request: TextGenerationParams, cancelled: threading.Event | None = None) -> list[int]:
        """The prompt's ids (linear in its length; caller text never becomes a special
        token). `PromptTooLong` as soon as the context is reached, `PromptCancelled` once
        `cancelled` is set."""
        return self._prompt(request, cancelled)[1]

    def _prompt(self, request: TextGenerationParams, cancelled: threading.Event | None = None) -> tuple[str, list[int]]:
        """The rendered prompt and its ids (see `prompt_tokens`)."""
        self._require_loaded()
        try:
            return prompt_and_tokens(self._tokenizer, request, specials=self._specials, limit=self._n_ctx,
                                     cancelled=cancelled, switches=self._reasoning_switches)
        except PromptOverContext as over:
            raise PromptTooLong(over.tokens_so_far, self._n_ctx) from None

    def _prepare(
        self, request: TextGenerationParams, cancelled: threading.Event | None = None
    ) -> tuple[list[int], int, SamplingParams, TokenChooser | None, bool]:
        """Prompt ids, the most tokens this request may generate, its sampling, the shaped
        sampler when it asks for more than plain sampling (checked first: a bad logit_bias
        id or grammar fails before the prompt is tokenized), and whether the chat template
        opened the think block (not under a grammar: the output is then the call or the
        JSON, never thought)."""
        stage = self._require_loaded()
        shaping = shaping_of(request)
        if not shaping.idle and not stage.role.computes_logits:
            # Only a pipeline group gets here (the traits table refuses it at the API).
            raise EngineError("logprobs, logit bias, penalties and grammars need rank 0 to compute the logits; "
                              "this pipeline group samples on its last rank")
        text, prompt = self._prompt(request, cancelled)
        opens = request.prompt is None and shaping.grammar is None and opens_reasoning(text)
        n_ctx = min(self._n_ctx, request.context_tokens or self._n_ctx)
        if len(prompt) >= n_ctx:
            raise PromptTooLong(len(prompt), n_ctx)
        max_new = max_new_tokens(request.max_tokens, len(prompt), n_ctx)
        params = resolve_sampling(request.temperature, request.top_p, request.top_k, request.seed, secrets.randbits(31),
                                  request.min_p)
        vocab = self._vocab_size or len(self._token_bytes)
        chooser = None if shaping.idle else TokenChooser(Sampler(params), shaping, vocab, self._grammar_matcher)
        return prompt, max_new, params, chooser, opens

    def _grammar_matcher(self, schema: str) -> GrammarMatcher:
        """A constrained-decoding matcher for the JSON Schema text `schema`; llguidance's
        tokenizer is built on the first grammar request and kept for the model's lifetime."""
        if self._grammar_tokenizer is None:
            hf = getattr(self._tokenizer, "_tokenizer", self._tokenizer)
            self._grammar_tokenizer = llguidance_tokenizer(hf, sorted(self._eos))
        return GrammarMatcher(self._grammar_tokenizer, schema)

    def _lead(self, request: TextGenerationParams, cancelled: threading.Event) -> Iterator[GeneratedToken]:
        try:
            prompt, max_new, params, chooser, opens = self._prepare(request, cancelled)
        except PromptCancelled:
            return  # the caller went away while the prompt was tokenized
        prefixes = self._prefixes
        cached = prefixes.prepare(prompt) if prefixes is not None else 0
        self._chooser = chooser
        self._command(Header(OP_BEGIN, seed=params.seed, temperature=params.temperature,
                             top_p=params.top_p, top_k=params.top_k, min_p=params.min_p))
        state: dict[str, int | None] = {"last": None}
        # A shaped sampler (logprobs, grammar, penalties) reads each token's logits as it is
        # handed out: those requests step one token at a time.
        drafter = self._draft.propose if self._draft is not None else prompt_lookup
        drafting = Speculation(list(prompt), max_new, drafter) if self._speculative and chooser is None else None

        def plain_step(fed: int) -> int:
            sampled = self._command(Header(OP_STEP, n_tokens=1, sample=True), [fed])
            assert sampled is not None  # a sampling step always answers its token
            return sampled

        def fed_to_cache(tokens: list[int]) -> None:
            if prefixes is not None:
                prefixes.hot_tokens.extend(tokens)

        def next_token() -> int:
            fed = state["last"]
            if fed is None:
                state["last"] = token = self._prefill(prompt[cached:])
                if prefixes is not None:
                    prefixes.hot_tokens = list(prompt)
                if drafting is not None:
                    drafting.handed(token)
            elif drafting is not None:
                sampler = self._sampler
                assert sampler is not None  # set by OP_BEGIN
                state["last"] = token = drafting.next_token(
                    fed, plain_step, lambda tokens: verify(self._require_loaded(), self._cache, sampler, tokens),
                    fed_to_cache,
                    lambda count: trim(self._cache, count))
            else:
                state["last"] = token = plain_step(fed)
                fed_to_cache([fed])
            return token

        try:
            text = self._text(request, len(prompt), max_new, next_token, cancelled, chooser, cached, opens)
            yield from (text if drafting is None else with_draft_counts(text, drafting))
        except Exception:
            # A step failed part-way: its KV is not trusted again. (A consumer closing the
            # stream lands between steps, where the hot tokens match the cache exactly.)
            if prefixes is not None:
                prefixes.forget_hot()
            raise
        finally:
            self._chooser = None
            # Finished, cancelled, or the client went away: the followers drop the request
            # too. A broken group has nobody left to tell (and the runner is about to exit).
            if self._broken is None:
                self._command(Header(OP_END))

    def _batched(self, request: TextGenerationParams, cancelled: threading.Event) -> Iterator[GeneratedToken]:
        try:
            prompt, max_new, params, chooser, opens = self._prepare(request, cancelled)
        except PromptCancelled:
            return  # the caller went away while the prompt was tokenized
        assert self._batch is not None
        plain_greedy = chooser is None and params.greedy  # the batch's own argmax serves it
        sampler = chooser or (None if plain_greedy else Sampler(params))
        sequence = self._batch.submit(BatchSequence(prompt, max_new, sampler, raw_logits=chooser is not None))
        stall_s = seconds_from_env(os.environ, EVAL_TIMEOUT_ENV, EVAL_TIMEOUT_S)

        def take() -> int:
            deadline = time.monotonic() + stall_s
            while True:
                try:
                    item = sequence.out.get(timeout=0.05)
                    break
                except queue.Empty:
                    if cancelled.is_set():
                        return -1  # _text checks cancellation before using it
                    if time.monotonic() > deadline:
                        raise EngineError(f"the MLX batch produced no token within {stall_s:g}s") from None
            if isinstance(item, BaseException):
                raise item  # this request's own sampler failed, or the whole loop did (EngineBroken)
            return item[0]

        with self._count_lock:
            self._in_flight += 1
        try:
            # The first token first: by then the loop has said how much of the prompt came
            # from the prefix cache (the usage the last token reports).
            pending = [take()]

            def next_token() -> int:
                return pending.pop() if pending else take()

            yield from self._text(request, len(prompt), max_new, next_token, cancelled, chooser, sequence.cached,
                                  opens)
        finally:
            self._batch.remove(sequence)
            with self._count_lock:
                self._in_flight -= 1

    def _text(self, request: TextGenerationParams, n_prompt: int, max_new: int, next_token: Callable[[], int],
              cancelled: threading.Event, chooser: TokenChooser | None = None, cached: int = 0,
              opens: bool = False) -> Iterator[GeneratedToken]:
        """Tokens to client text: end-of-generation, stop strings, UTF-8, max_tokens, usage,
        and each token's logprobs when the request asked. `opens`: the template opened the
        think block, so the output starts inside it: said first, as if the model wrote it."""
        if opens:
            yield GeneratedToken(REASONING_OPEN, prompt_tokens=n_prompt)
        for out in self._plain_text(request, n_prompt, max_new, next_token, cancelled, cached, not opens):
            scores = chooser.pop_scores() if chooser is not None else None
            if scores is None or out.token_id is None:
                yield out
                continue
            chosen, best = scores
            tops = [TopLogprob(token=self._token_text(i), logprob=lp, token_id=i) for i, lp in best]
            plain = {f.name: getattr(out, f.name) for f in fields(GeneratedToken)}
            yield ScoredToken(**plain, logprob=chosen, top_logprobs=tops)

    def _token_text(self, token: int) -> str:
        raw = self._token_bytes[token] if 0 <= token < len(self._token_bytes) else b""
        return raw.decode("utf-8", errors="replace")

    def _plain_text(self, request: TextGenerationParams, n_prompt: int, max_new: int, next_token: Callable[[], int],
                    cancelled: threading.Event, cached: int = 0, announce_prompt: bool = True) -> Iterator[GeneratedToken]:
        return token_loop(next_token, self._token_bytes.__getitem__, self._eos.__contains__, n_prompt=n_prompt,
                          max_new=max_new, stop=request.stop, cancelled=cancelled, cached=cached,
                          announce_prompt=announce_prompt)

    def _prefill(self, prompt: list[int]) -> int:
        token: int | None = None
        for start in range(0, len(prompt), PREFILL_CHUNK_TOKENS):
            chunk = prompt[start : start + PREFILL_CHUNK_TOKENS]
            last = start + PREFILL_CHUNK_TOKENS >= len(prompt)
            token = self._command(Header(OP_STEP, n_tokens=len(chunk), sample=last), chunk)
        assert token is not None
        return token

    def _command(self, header: Header, tokens: list[int] | None = None) -> int | None:
        """Run one header on every rank (broadcast first when there is a group)."""
        stage = self._require_loaded()
        if stage.role.tensor and header.op == OP_STEP:
            header = Header(header.op, header.n_tokens, header.sample, tokens_follow=True)
        if self._broken is not None:
            raise self._broken
        if stage.role.world > 1:
            self._broadcast(header, tokens)
        return self._apply(header, tokens)

    def _tell_followers_to_stop(self) -> None:
        done = threading.Event()

        def send() -> None:
            try:
                self._broadcast(Header(OP_SHUTDOWN), None, guarded=False)
            except Exception as exc:  # followers already gone: nothing to tell
                log.info("followers not told to stop: %s", exc)
            done.set()

        threading.Thread(target=send, name="mlx-shutdown", daemon=True).start()
        if not done.wait(SHUTDOWN_BROADCAST_TIMEOUT_S):
            log.warning("followers did not take the shutdown within %ss", SHUTDOWN_BROADCAST_TIMEOUT_S)

    # -- followers (rank > 0) -------------------------------------------------------------

    def _follow_forever(self) -> None:
        try:
            while self._follow_one(begin_timeout_s=None) != OP_SHUTDOWN:
                pass
            log.info("rank %d: leader shut the group down", self.rank)
        except Exception as exc:
            self._die(f"follower lost its group: {exc}")

    def _follow_one(self, begin_timeout_s: float | None) -> int:
        """Receive and run one header; returns its op. Waiting for the next request is
        unguarded unless `begin_timeout_s` is given (idle is normal); inside a request every
        wait is guarded by the eval watchdog."""
        import mlx.core as mx

        stage = self._require_loaded()
        inside_request = self._sampler is not None
        zeros = mx.zeros((HEADER_LEN,), dtype=mx.int32)
        summed = mx.distributed.all_sum(zeros, group=self._group)
        if inside_request:
            with self._guard("follower header"):
                mx.eval(summed)
        elif begin_timeout_s is not None:
            with self._guard("waiting for the leader's first request", begin_timeout_s):
                mx.eval(summed)
        else:
            mx.eval(summed)
        header = Header.decode(cast(list[int], summed.tolist()))  # a 1-D int32 array's list
        tokens = None
        if header.tokens_follow:
            received = mx.distributed.all_sum(mx.zeros((header.n_tokens,), dtype=mx.int32), group=self._group)
            with self._guard("follower tokens"):
                mx.eval(received)
            tokens = [int(t) for t in cast(list[int], received.tolist())]
        if header.op not in (OP_BEGIN, OP_STEP, OP_END, OP_SHUTDOWN):
            raise GroupBroken(f"unknown op {header.op} from rank 0 (rank {stage.role.rank})")
        self._apply(header, tokens)
        return header.op

    # -- the step every rank runs ---------------------------------------------------------

    def _broadcast(self, header: Header, tokens: list[int] | None, guarded: bool = True) -> None:
        import mlx.core as mx

        # One eval per collective: two independent collectives in one eval may run in either
        # order, and the followers evaluate them in this order.
        messages = [header.encode()]
        if header.tokens_follow:
            assert tokens is not None and len(tokens) == header.n_tokens
            messages.append(tokens)
        for message in messages:
            summed = mx.distributed.all_sum(mx.array(message, dtype=mx.int32), group=self._group)
            with self._collective("header broadcast", None, guarded):
                mx.eval(summed)

    def _apply(self, header: Header, tokens: list[int] | None) -> int | None:
        stage = self._require_loaded()
        if header.op == OP_BEGIN:
            # A single rank decodes on its prefix cache's hot cache, already trimmed (or
            # restored) to the prompt's cached prefix; a group starts every request afresh.
            self._cache = self._prefixes.hot if self._prefixes is not None else stage.make_cache()
            self._sampler = Sampler(SamplingParams(header.temperature, header.top_p, header.top_k, header.seed,
                                                   header.min_p))
            return None
        if header.op == OP_END:
            self._cache, self._sampler = [], None
            return None
        if header.op == OP_STEP:
            return self._step(header, tokens)
        return None

    def _step(self, header: Header, tokens: list[int] | None) -> int | None:
        """One forward step over `header.n_tokens` positions; the sampled token on rank 0
        (when `header.sample`), else None."""
        import mlx.core as mx

        stage = self._require_loaded()
        role = stage.role
        if self._sampler is None:
            raise GroupBroken(f"rank {role.rank}: STEP outside a request")
        group = self._group
        if stage.whole is not None:  # one rank, the whole mlx-lm model
            assert tokens is not None
            logits = whole_model_logits(stage, mx.array(tokens, dtype=mx.int32), self._cache)
            if not header.sample:
                mx.eval(logits)  # commit the KV cache of this prefill chunk
                return None
            sample = self._chooser if self._chooser is not None else self._sampler
            token = sample(logits)
            mx.eval(token)
            return int(token.item())
        if role.embeds:
            assert tokens is not None
            hidden = embed_tokens(stage, mx.array(tokens, dtype=mx.int32))
        else:
            hidden = mx.distributed.recv(
                (1, header.n_tokens, self._hidden_size), self._activation_dtype, role.rank - 1, group=group
            )
        hidden = forward_layers(stage, hidden, self._cache)
        layers = f"rank {role.rank} layers [{role.start_layer}, {role.end_layer})"
        # The layers' evaluation includes the receive from the previous rank (pipeline) or
        # the per-layer all_sums (tensor): a peer lost there is named like any other.
        peer = None if role.tensor else role.rank - 1
        with self._guard(layers) if role.embeds and not role.tensor else self._collective(layers, peer):
            mx.eval(hidden)  # commit the graph (and the KV cache) before anything is sent
        if role.tensor:
            # Two ring all_sums per layer; each rank sends 2(n-1)/n of the summed bytes.
            self.bytes_sent += 2 * len(stage.layers) * hidden.nbytes * 2 * (role.world - 1) // role.world
        if role.sends_activations:
            with self._collective(f"rank {role.rank} send", role.rank + 1):
                mx.eval(mx.distributed.send(hidden, role.rank + 1, group=group))
            self.bytes_sent += hidden.nbytes
        if not header.sample:
            return None
        token: Any = None
        if role.computes_logits and (role.rank == 0 or role.returns_token):
            # Tensor followers skip the head: rank 0's token reaches them in the next header.
            # A shaped request's chooser (rank 0 only) evaluates the logits as it samples.
            sample = self._chooser if role.rank == 0 and self._chooser is not None else self._sampler
            with self._guard(f"rank {role.rank} sample"):
                token = sample(last_logits(stage, hidden))
                mx.eval(token)
            if role.returns_token:
                with self._collective(f"rank {role.rank} token", 0):
                    mx.eval(mx.distributed.send(token, 0, group=group))
                self.bytes_sent += token.nbytes
        if role.awaits_token:
            token = mx.distributed.recv((1,), mx.int32, role.world - 1, group=group)
            with self._collective("rank 0 waiting for the sampled token", role.world - 1):
                mx.eval(token)
        return int(token.item()) if role.rank == 0 else None

    # -- helpers --------------------------------------------------------------------------

    @contextmanager
    def _collective(self, label: str, peer: int | None, guarded: bool = True) -> Iterator[None]:
        """Evaluate one collective with `peer` (None: every other rank) under the eval
        watchdog; a failure becomes GroupBroken naming the peer's node, and marks the group
        broken so no later step tries to use it."""
        ranks = [peer] if peer is not None else [r for r in range(len(self._rank_nodes)) if r != self._my_rank]
        nodes = ", ".join(sorted({self._rank_nodes[r] for r in ranks})) if self._rank_nodes else "unknown"
        described = f"{label} with rank {', '.join(map(str, ranks))} (node {nodes})"
        try:
            with self._guard(described) if guarded else nullcontext():
                yield
        except Exception as exc:
            self._broken = GroupBroken(f"lost node {nodes} (or its runner): the MLX ring broke during {described}: {exc}")
            raise self._broken from exc

    def _guard(self, label: str, timeout_s: float | None = None) -> AbstractContextManager[None]:
        if self._watchdog is None:
            return nullcontext()
        return self._watchdog.guard(label, timeout_s)

    def _die(self, reason: str) -> None:
        log.critical("%s; the group is out of step, exiting with code %d", reason, EXIT_GROUP_WEDGED)
        os._exit(EXIT_GROUP_WEDGED)

    def _require_loaded(self) -> Stage:
        if self._stage is None:
            raise EngineNotLoaded("no model is loaded")
        return self._stage


def _quantized_prompt_cache(model: Any, kv: KvQuantization | None) -> list[Any]:
    """mlx-lm's fresh prompt cache for `model`, quantized as the placement says."""
    from mlx_lm.models.cache import make_prompt_cache

    return quantized_cache(make_prompt_cache(model), kv)


def _activation_dtype(stage: Stage) -> Any:
    """The dtype hidden states travel in: that of the stage's floating weights (norms are
    never quantized, so a floating parameter always exists)."""
    import mlx.core as mx
    from mlx.utils import tree_flatten

    if not stage.layers:
        return mx.float32  # a whole-model stage sends no activations
    for _, value in cast(list[tuple[str, Any]], tree_flatten(stage.layers[0].parameters())):  # no destination: a list
        if mx.issubdtype(value.dtype, mx.floating):
            return value.dtype
    return mx.float32


__all__ = ["METAL_FAST_SYNCH_ENV", "PREFILL_CHUNK_TOKENS", "GroupBroken", "MlxEngine", "metal_fast_synch_env"]
