"""The MLX engine's vision path: a model whose card sees (capability "vision") and whose
config has a vision tower, loaded and run whole on one rank through mlx-vlm.

mlx-lm has no vision towers; mlx-vlm loads the same safetensors folders with their tower and
projector (LLaVA, Qwen2-VL, Gemma 3, ...). The runner picks this engine instead of
`engine.MlxEngine` for such a card (`runner.bootstrap.VISION_ENGINES`). A request's prompt
is rendered with the tokenizer's own chat template exactly as the text path renders it
(`text.prompt_and_tokens`); each image marker becomes the family's placeholder token (LLaVA's
`<image>`, Gemma 3's `<start_of_image>`), and each placeholder is then replaced by the ids the
model's own processor gives that image's placeholder (LLaVA: `<image>` once per embedding;
Gemma 3: `\n\n<start_of_image>`, a soft token per embedding, `<end_of_image>\n\n`;
Qwen2.5-VL: `<|image_pad|>` per merged patch of the image's grid, framed by the
`<|vision_start|>` and `<|vision_end|>` its chat template writes), so the
prompt's length (usage.prompt_tokens) counts every image position. The images' pixels come
from the model's own processor; mlx-vlm puts their embeddings where the image tokens are and
decodes. Per-family quirks are data (`VISION_FAMILIES`), keyed by config.json's model_type.

What it honours is in the engine traits table (`EngineTraits.vision_features`): images and
plain sampling (temperature, top_p, top_k, min_p, seed), stop strings and max_tokens;
logprobs, grammars, penalties and logit bias are refused there, at the API, by name, and
again here. One request at a time, one rank: placement never spans a vision MLX model
(`skulk.shared.types.engines.shards_model`). This module never reads cluster state and
never manages threads; everything arrives in the `ShardSpec`.
"""

from __future__ import annotations

import io
import json
import logging
import secrets
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from skulk.shared.types.cards import backend_engine
from skulk.shared.types.engines import MLX_VLM_VISION_TYPES
from skulk.shared.types.ids import ModelId
from skulk.shared.types.media import ImageInput
from skulk.shared.types.tasks import TextGenerationParams
from skulk.worker.engines.base import (
    EngineBusy,
    EngineError,
    EngineNotLoaded,
    GeneratedToken,
    ModelLoadFailed,
    PromptTooLong,
    ShardSpec,
)
from skulk.worker.engines.mlx.sampling import Sampler, resolve_sampling, shaping_of
from skulk.worker.engines.mlx.text import prompt_and_tokens, special_tokens, token_bytes_table
from skulk.worker.engines.prompt_pieces import PromptCancelled, PromptOverContext
from skulk.worker.engines.token_loop import max_new_tokens, token_loop

log = logging.getLogger(__name__)

WARM_UP_PROMPT = "Hello"
WARM_UP_TOKENS = 2
WARM_UP_IMAGE_SIDE_PX = 8
"""The warm-up sends one tiny grey image as well, so a tower or processor that cannot run
fails the load (the runner reports Failed) rather than the first client's request."""

PROCESSOR_OUTPUTS_IGNORED = frozenset({"input_ids", "attention_mask"})
"""What a processor returns beside the pixel tensors: the prompt ids are ours."""


@dataclass(frozen=True)
class VisionFamily:
    """How one mlx-vlm family places images in its prompt."""

    placeholder_attr: str
    """The processor attribute naming the token a prompt holds once per image, the one the
    processor expands (LLaVA's `image_token`, Gemma 3's `boi_token`)."""
    attention_mask: bool = False
    """Whether the model's embedding step reads the prompt's attention mask (Gemma 3's does:
    mlx-vlm builds its mask from it; LLaVA's ignores it)."""
    frame: tuple[str, str] | None = None
    """Special tokens around each image that the family's chat template writes and its
    processor does not (Qwen2.5-VL's `<|vision_start|>` ... `<|vision_end|>`, from which its
    M-RoPE numbers the image's positions in 2D)."""


VISION_FAMILIES: Mapping[str, VisionFamily] = MappingProxyType({
    "llava": VisionFamily("image_token"),
    "gemma3": VisionFamily("boi_token", attention_mask=True),
    "qwen2_5_vl": VisionFamily("image_token", frame=("<|vision_start|>", "<|vision_end|>")),
})
"""config.json `model_type` -> its image placement; exactly the families of
`MLX_VLM_VISION_TYPES` (checked at import): a family joins both once a test shows it serves."""

if frozenset(VISION_FAMILIES) != MLX_VLM_VISION_TYPES:
    raise RuntimeError(f"VISION_FAMILIES {sorted(VISION_FAMILIES)} must match MLX_VLM_VISION_TYPES "
                       f"{sorted(MLX_VLM_VISION_TYPES)}")


class VisionModelError(EngineError):
    """An image this model's processor cannot turn into embeddings (undecodable, or a shape
    its family does not take); the request fails with this message."""


def has_vision_tower(config: dict[str, Any]) -> bool:
    """Whether a model folder's config.json describes a vision tower (mlx-vlm's families
    keep it in `vision_config`)."""
    return isinstance(config.get("vision_config"), dict)


def expanded(prompt: Sequence[int], placeholder_id: int, blocks: Sequence[Sequence[int]]) -> list[int]:
    """`prompt` with its i-th placeholder token replaced by `blocks[i]`: the ids the model's
    processor gives the i-th image (its image tokens, and any framing the family adds). The
    count of placeholders must equal `len(blocks)`."""
    found = sum(1 for token in prompt if token == placeholder_id)
    if found != len(blocks):
        raise VisionModelError(f"the prompt holds {found} image token(s) for {len(blocks)} image(s)")
    out: list[int] = []
    images = iter(blocks)
    for token in prompt:
        if token == placeholder_id:
            out.extend(next(images))
        else:
            out.append(token)
    return out


def image_block(ids: Sequence[int], added: Sequence[int]) -> list[int]:
    """The processor's ids for a lone placeholder (`ids`) less what the tokenizer adds to any
    text (`added`, its ids for "": BOS, say), at the front: the ids one image takes."""
    n = len(added)
    return list(ids[n:]) if n and list(ids[:n]) == list(added) else list(ids)


def _processor_token(processor: Any, tokenizer: Any, attr: str) -> str:
    token = getattr(processor, attr, None) or getattr(tokenizer, attr, None)
    if not isinstance(token, str) or not token:
        raise ModelLoadFailed(f"the model's processor names no {attr}; mlx-vlm cannot place images in its prompt")
    return token


class MlxVisionEngine:
    """`Engine` over an mlx-vlm model on one rank, one request at a time."""

    def __init__(self) -> None:
        self._model: Any = None
        self._processor: Any = None
        self._tokenizer: Any = None
        self._token_bytes: list[bytes] = []
        self._specials: dict[str, int] = {}
        self._eos: frozenset[int] = frozenset()
        self._image_token = ""
        self._image_token_id = -1
        self._placeholder = ""
        self._placeholder_id = -1
        self._added_ids: list[int] = []
        self._frame_ids: tuple[int, int] | None = None
        self._family = VISION_FAMILIES["llava"]
        self._n_ctx = 0
        self._model_id = ModelId("")
        self._switches: tuple[str, ...] = ()
        self._busy = threading.Lock()
        self._in_flight = 0

    # -- protocol -------------------------------------------------------------------------

    @property
    def concurrency(self) -> int:
        return 1

    @property
    def in_flight(self) -> int:
        return self._in_flight

    @property
    def context_tokens(self) -> int:
        return self._n_ctx

    def load(self, spec: ShardSpec) -> None:
        shard = spec.shard
        if backend_engine(shard.backend) != "mlx":
            raise ModelLoadFailed(f"shard backend {shard.backend!r} is not an mlx backend")
        if shard.world_size != 1:
            # Placement never spans a model that sees on MLX; this guards a stale plan.
            raise ModelLoadFailed(f"a vision model runs on one MLX rank, not {shard.world_size}")
        if (spec.card.runtime.speculative or "none") != "none":
            # mlx-vlm's loop has no verification step: refused rather than served undrafted.
            raise ModelLoadFailed(f"the MLX vision path (mlx-vlm) does not speculate; place {spec.card.model_id} "
                                  f"without runtime.speculative ({spec.card.runtime.speculative!r})")
        path = Path(spec.model_path)
        try:
            config = json.loads((path / "config.json").read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ModelLoadFailed(f"no MLX/HF model directory at {spec.model_path}: {exc}") from exc
        if not has_vision_tower(config):
            raise ModelLoadFailed(f"{spec.card.model_id}'s card says it sees, but {path}/config.json has no "
                                  "vision_config (no vision tower to load)")
        family = VISION_FAMILIES.get(str(config.get("model_type")))
        if family is None:
            raise ModelLoadFailed(f"{spec.card.model_id}'s model_type {config.get('model_type')!r} is not a family "
                                  f"the MLX vision path serves ({', '.join(sorted(VISION_FAMILIES))})")
        try:
            from mlx_vlm.utils import load as load_vlm

            model, processor = load_vlm(str(path))
        except ImportError as exc:
            raise ModelLoadFailed(f"mlx-vlm is not installed on this node ({exc}); it ships with Skulk on "
                                  "macOS, elsewhere `pip install mlx-vlm` into Skulk's environment") from exc
        except Exception as exc:
            raise ModelLoadFailed(f"mlx-vlm could not load {path}: {exc}") from exc
        from mlx_lm.tokenizer_utils import TokenizerWrapper

        hf_tokenizer = getattr(processor, "tokenizer", processor)
        image_token = _processor_token(processor, hf_tokenizer, "image_token")
        placeholder = _processor_token(processor, hf_tokenizer, family.placeholder_attr)
        # The text helpers read the HF tokenizer as mlx-lm's wrapper holds it (`_tokenizer`).
        tokenizer = TokenizerWrapper(hf_tokenizer)
        specials = special_tokens(tokenizer)
        for token in (image_token, placeholder, *(family.frame or ())):
            if token not in specials:
                raise ModelLoadFailed(f"the image token {token!r} is not a special token of the tokenizer")
        self._model, self._processor, self._tokenizer = model, processor, tokenizer
        self._token_bytes = token_bytes_table(tokenizer)
        self._specials = specials
        self._image_token, self._image_token_id = image_token, specials[image_token]
        self._placeholder, self._placeholder_id = placeholder, specials[placeholder]
        self._added_ids = _flat_ids(hf_tokenizer("")["input_ids"])
        self._frame_ids = (specials[family.frame[0]], specials[family.frame[1]]) if family.frame else None
        self._family = family
        eos = getattr(model.config, "eos_token_id", None) or getattr(hf_tokenizer, "eos_token_id", None)
        self._eos = frozenset(int(t) for t in (eos if isinstance(eos, list) else [eos] if eos is not None else []))
        self._n_ctx = min(spec.instance.context_token_limit, spec.card.context_length)
        self._model_id = ModelId(spec.card.model_id)
        self._switches = spec.card.reasoning.switches
        log.info("loaded %s through mlx-vlm (model_type %s, image token %r) n_ctx=%d", path,
                 config.get("model_type"), image_token, self._n_ctx)

    def warm_up(self) -> None:
        from PIL import Image

        from skulk.shared.types.common import ChatMessage
        from skulk.shared.types.media import IMAGE_MARKER

        buffer = io.BytesIO()
        side = WARM_UP_IMAGE_SIDE_PX
        Image.new("RGB", (side, side), "grey").save(buffer, format="PNG")
        image = ImageInput.of(buffer.getvalue(), "image/png", side, side)
        request = TextGenerationParams(
            model_id=self._model_id, max_tokens=WARM_UP_TOKENS, temperature=0.0,
            messages=[ChatMessage(role="user", content=f"{IMAGE_MARKER}{WARM_UP_PROMPT}", images=[image])])
        for _ in self.generate(request, threading.Event()):
            pass

    def generate(self, request: TextGenerationParams, cancelled: threading.Event) -> Iterator[GeneratedToken]:
        self._require_loaded()
        if not self._busy.acquire(blocking=False):
            raise EngineBusy("the MLX vision engine runs one generation at a time")
        try:
            self._in_flight = 1
            yield from self._generate(request, cancelled)
        finally:
            self._in_flight = 0
            self._busy.release()

    def prompt_token_count(self, request: TextGenerationParams) -> int:
        """The prompt's length as the model sees it, each image's embeddings included."""
        prompt, _ = self._inputs(request, None, pixels=False)
        return len(prompt)

    def close(self) -> None:
        self._model = None
        self._processor = None

    # -- internals ------------------------------------------------------------------------

    def _require_loaded(self) -> None:
        if self._model is None:
            raise EngineNotLoaded("no model loaded")

    def _inputs(self, request: TextGenerationParams, cancelled: threading.Event | None,
                pixels: bool = True) -> tuple[list[int], dict[str, Any]]:
        """The prompt ids (image tokens expanded) and the processor's pixel tensors."""
        images = [image for message in request.messages for image in message.images]
        try:
            _, prompt = prompt_and_tokens(self._tokenizer, request, specials=self._specials, limit=self._n_ctx,
                                          cancelled=cancelled, switches=self._switches,
                                          image_token=self._placeholder if images else None)
        except PromptOverContext as over:
            raise PromptTooLong(over.tokens_so_far, self._n_ctx) from None
        if not images:
            return prompt, {}
        blocks: list[list[int]] = []
        tensors: list[dict[str, Any]] = []
        for image in images:
            block, tensor = self._processed(image)
            blocks.append(block)
            tensors.append(tensor)
        prompt = expanded(prompt, self._placeholder_id, blocks)
        return prompt, (_concatenated(tensors) if pixels else {})

    def _processed(self, image: ImageInput) -> tuple[list[int], dict[str, Any]]:
        """The prompt ids `image` takes and its pixel tensors, from the model's own processor
        (it expands the placeholder per image, as the model was trained)."""
        from PIL import Image, UnidentifiedImageError

        try:
            with Image.open(io.BytesIO(image.data)) as opened:
                picture = opened.convert("RGB")
        except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError) as exc:
            raise VisionModelError(f"an image could not be decoded: {exc}") from exc
        try:
            out = self._processor(text=[self._placeholder], images=[picture])
        except Exception as exc:
            raise VisionModelError(f"the model's processor refused an image: {exc}") from exc
        block = image_block(_flat_ids(out["input_ids"]), self._added_ids)
        if not any(token == self._image_token_id for token in block):
            raise VisionModelError("the model's processor gave an image no prompt positions")
        if self._frame_ids is not None:
            block = [self._frame_ids[0], *block, self._frame_ids[1]]
        return block, {key: value for key, value in out.items()
                       if key not in PROCESSOR_OUTPUTS_IGNORED and value is not None}

    def _generate(self, request: TextGenerationParams, cancelled: threading.Event) -> Iterator[GeneratedToken]:
        import mlx.core as mx
        from mlx_vlm.generate.ar import generate_step

        shaping = shaping_of(request)
        if not shaping.idle:
            # The traits table refuses these at the API and the dispatcher; this is the guard.
            raise EngineError("the MLX vision path samples plainly: no logprobs, logit bias, penalties or grammars")
        try:
            prompt, tensors = self._inputs(request, cancelled)
        except PromptCancelled:
            return
        n_ctx = min(self._n_ctx, request.context_tokens or self._n_ctx)
        if len(prompt) >= n_ctx:
            raise PromptTooLong(len(prompt), n_ctx)
        max_new = max_new_tokens(request.max_tokens, len(prompt), n_ctx)
        params = resolve_sampling(request.temperature, request.top_p, request.top_k, request.seed,
                                  secrets.randbits(31), request.min_p)
        pixel_values = tensors.pop("pixel_values", None)
        mask = mx.ones((1, len(prompt)), dtype=mx.int32) if self._family.attention_mask else None
        sampler = Sampler(params)
        # mlx-vlm hands the sampler a batch of one, (1, vocab); ours reads one row of logits.
        steps = generate_step(mx.array([prompt]), self._model, pixel_values, mask, max_tokens=max_new,
                              sampler=lambda logprobs: sampler(logprobs.reshape(-1)), **tensors)

        def next_token() -> int:
            token, _ = next(steps)
            return int(token)

        try:
            yield from token_loop(next_token, self._token_bytes.__getitem__, self._eos.__contains__,
                                  n_prompt=len(prompt), max_new=max_new, stop=request.stop, cancelled=cancelled)
        finally:
            steps.close()


def _flat_ids(ids: Any) -> list[int]:
    """A processor's input_ids (a batch of one, as an mx/np array or nested list) as ints."""
    import numpy as np

    return [int(t) for t in np.asarray(ids).reshape(-1).tolist()]


def _concatenated(tensors: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Per-image processor outputs joined along the batch axis, key by key."""
    import mlx.core as mx

    keys = list(tensors[0])
    out: dict[str, Any] = {}
    for key in keys:
        values = [t[key] for t in tensors if key in t]
        if len(values) != len(tensors):
            raise VisionModelError(f"the processor gave {key!r} for some images only")
        try:
            out[key] = mx.concatenate([mx.array(v) for v in values], axis=0) if len(values) > 1 else mx.array(values[0])
        except Exception as exc:
            raise VisionModelError(f"the images' {key!r} cannot be joined (differing shapes?): {exc}") from exc
    return out


__all__ = ["VISION_FAMILIES", "MlxVisionEngine", "VisionFamily", "VisionModelError", "expanded", "has_vision_tower",
           "image_block"]
