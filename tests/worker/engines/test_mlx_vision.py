"""MLX's vision path (mlx-vlm) on each family it serves, each on its generated tiny model
(`local/tiny-vlm`: LLaVA; `local/tiny-gemma3-vlm`: Gemma 3; `local/tiny-qwen2.5-vl`:
Qwen2.5-VL): the image reaches the model (two
different images, two different greedy answers; the same image, the same answer), its
positions are counted in the prompt exactly as the model's own processor lays them out, and
what the path does not honour is refused by name. The pure helpers (marker to placeholder,
placeholder expansion) are table-driven."""

from __future__ import annotations

import io
import threading
from pathlib import Path

import pytest
from PIL import Image

from skulk.models.cards import builtin_cards_dir, load_card
from skulk.models.tiny_models import GEMMA3_BOI_TOKEN, GEMMA3_EOI_TOKEN, IMAGE_TOKEN, TINY_VISION_SPEC
from skulk.shared.types.common import ChatMessage
from skulk.shared.types.engines import (
    MLX_VLM_VISION_TYPES,
    Feature,
    honoured_features,
    missing_features,
    on_vision_path,
    sees_images,
    shards_model,
)
from skulk.shared.types.ids import ModelId
from skulk.shared.types.media import IMAGE_MARKER, ImageInput
from skulk.shared.types.tasks import TextGenerationParams
from skulk.worker.engines.base import GeneratedToken, ModelLoadFailed, ShardSpec
from skulk.worker.engines.mlx.text import images_as
from skulk.worker.engines.mlx.vision import (
    VISION_FAMILIES,
    MlxVisionEngine,
    VisionModelError,
    expanded,
    has_vision_tower,
    image_block,
)
from skulk.worker.engines.prompt_pieces import Segment
from skulk.worker.runner.bootstrap import engine_factory
from tests.worker.engines.mlx_ranks import local_instance

pytestmark = pytest.mark.timeout(180)

CARD = load_card(builtin_cards_dir() / "local--tiny-vlm.toml")
MODEL = ModelId(CARD.model_id)
CARDS = {"llava": CARD, "gemma3": load_card(builtin_cards_dir() / "local--tiny-gemma3-vlm.toml"),
         "qwen2_5_vl": load_card(builtin_cards_dir() / "local--tiny-qwen2.5-vl.toml")}
"""The generated model each served family is tested on."""

SMALL, SQUARE = (40, 30), (64, 64)
IMAGE_POSITIONS = {
    # Every image resized to the tower's 32x32: 16 patch embeddings.
    "llava": {SMALL: TINY_VISION_SPEC.image_tokens, SQUARE: TINY_VISION_SPEC.image_tokens},
    # "\n\n<start_of_image>" + a soft token per embedding + "<end_of_image>\n\n"; the tiny
    # tokenizer has a token per newline.
    "gemma3": {size: 2 + 1 + TINY_VISION_SPEC.image_tokens + 1 + 2 for size in (SMALL, SQUARE)},
    # "<|vision_start|>" + an "<|image_pad|>" per 2x2 merged 8 px patch + "<|vision_end|>":
    # 40x30 resizes to 32x32 (4x4 patches, 4 pads), 64x64 stays (8x8 patches, 16 pads).
    "qwen2_5_vl": {SMALL: 1 + 4 + 1, SQUARE: 1 + 16 + 1},
}
"""Prompt positions one image takes, per family and image size, as its processor lays them out."""


def png(colour: str, size: tuple[int, int] = SMALL) -> ImageInput:
    out = io.BytesIO()
    Image.new("RGB", size, colour).save(out, format="PNG")
    return ImageInput.of(out.getvalue(), "image/png", *size)


def ask(*images: ImageInput, max_tokens: int = 12, **kwargs) -> TextGenerationParams:
    content = "".join(IMAGE_MARKER for _ in images) + "What is this?"
    return TextGenerationParams(model_id=MODEL, max_tokens=max_tokens, temperature=0, **kwargs,
                                messages=[ChatMessage(role="user", content=content, images=list(images))])


def run(engine: MlxVisionEngine, request: TextGenerationParams) -> tuple[str, GeneratedToken]:
    tokens = list(engine.generate(request, threading.Event()))
    return "".join(t.text for t in tokens), tokens[-1]


@pytest.fixture(scope="module", params=sorted(CARDS))
def family(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def tiny_vlm(family, tmp_path_factory) -> Path:
    from skulk.artifacts.resolve import ensure_local_model

    path = ensure_local_model(CARDS[family], tmp_path_factory.mktemp("mlx-vlm-models"))
    config = __import__("json").loads((path / "config.json").read_text())
    assert has_vision_tower(config) and config["model_type"] == family
    return path


@pytest.fixture(scope="module")
def engine(family, tiny_vlm):
    card = CARDS[family]
    engine = MlxVisionEngine()
    engine.load(ShardSpec(instance=local_instance(card, 1), runner_id=local_instance(card, 1).shards[0].runner_id,
                          card=card, model_path=str(tiny_vlm)))
    engine.warm_up()
    yield engine
    engine.close()


def test_the_card_says_the_generated_folders_size_and_shape(family, tiny_vlm):
    import json

    card = CARDS[family]
    actual = sum(p.stat().st_size for p in tiny_vlm.rglob("*") if p.is_file())
    assert abs(card.storage_size_bytes - actual) <= actual * 0.05  # placement fits memory with it
    config = json.loads((tiny_vlm / "config.json").read_text())
    text = config.get("text_config", config)  # Qwen2.5-VL keeps its text fields at the top
    assert (text["num_hidden_layers"], text["hidden_size"], text["vocab_size"]) == (
        card.num_layers, card.hidden_size, card.vocab_size)


def test_the_image_steers_greedy_decoding(engine):
    black, white = run(engine, ask(png("black"))), run(engine, ask(png("white")))
    assert black[0] and white[0]
    assert black[0] != white[0]
    assert run(engine, ask(png("black")))[0] == black[0]  # the same image: the same answer
    assert black[1].finish_reason == "length"


def test_prompt_tokens_count_the_image_embeddings(engine, family):
    plain = run(engine, ask())[1].usage
    one = run(engine, ask(png("red")))[1].usage
    two = run(engine, ask(png("red"), png("blue", SQUARE)))[1].usage
    assert plain is not None and one is not None and two is not None
    # The marker becomes the family's placeholder, laid out as its processor lays out an image.
    positions = IMAGE_POSITIONS[family]
    assert one.prompt_tokens - plain.prompt_tokens == positions[SMALL]
    assert two.prompt_tokens - plain.prompt_tokens == positions[SMALL] + positions[SQUARE]
    assert engine.prompt_token_count(ask(png("red"))) == one.prompt_tokens


def test_the_context_check_counts_the_image(engine, family):
    from skulk.worker.engines.base import PromptTooLong

    plain = engine.prompt_token_count(ask())
    window = plain + IMAGE_POSITIONS[family][SMALL]  # the image fits only with no room to answer
    assert run(engine, ask(max_tokens=2).model_copy(update={"context_tokens": window}))[0]
    with pytest.raises(PromptTooLong):
        run(engine, ask(png("black"), max_tokens=2).model_copy(update={"context_tokens": window}))


def test_the_image_is_laid_out_as_the_models_processor_lays_it_out(engine, family, tiny_vlm):
    import numpy as np
    from mlx_vlm.utils import load as load_vlm

    from skulk.worker.engines.mlx.text import prompt_and_tokens

    _, processor = load_vlm(str(tiny_vlm))
    placeholder = getattr(processor, VISION_FAMILIES[family].placeholder_attr)
    frame = VISION_FAMILIES[family].frame or ("", "")
    request = ask(png("red"))
    text, _ = prompt_and_tokens(engine._tokenizer, request)
    # The processor given our rendered prompt expands the placeholder its own way; ours must
    # be the same ids (less the BOS its tokenizer adds: the template already wrote one).
    # (Qwen's chat template frames the placeholder; its processor expands only the pads.)
    out = processor(text=[text.replace(IMAGE_MARKER, frame[0] + placeholder + frame[1])],
                    images=[Image.new("RGB", SMALL, "red")])
    added = [int(t) for t in processor.tokenizer("")["input_ids"]]
    theirs = image_block([int(t) for t in np.asarray(out["input_ids"]).reshape(-1)], added)
    ours = engine._inputs(request, None, pixels=False)[0]
    assert ours == theirs
    framing = {"gemma3": [GEMMA3_BOI_TOKEN, GEMMA3_EOI_TOKEN], "qwen2_5_vl": list(frame)}.get(family, [])
    ids = processor.tokenizer.convert_tokens_to_ids(framing)
    assert [ours.count(i) for i in ids] == [1] * len(framing)  # each image framed once


def test_a_seeded_sample_repeats_and_the_seed_matters(engine):
    def sampled(seed: int) -> str:
        request = ask(png("black"), max_tokens=16).model_copy(update={"temperature": 1.5, "seed": seed})
        return run(engine, request)[0]

    assert sampled(7) == sampled(7)
    assert len({sampled(seed) for seed in (1, 2, 3)}) > 1


def test_text_only_requests_still_serve(engine):
    text, last = run(engine, TextGenerationParams(model_id=MODEL, prompt="The cluster", max_tokens=5,
                                                  temperature=0))
    assert text and last.usage is not None and last.usage.completion_tokens == 5


def test_an_undecodable_image_fails_the_request_by_name(engine):
    broken = ImageInput.of(b"\x89PNG\r\n\x1a\nnot really", "image/png", 4, 4)
    with pytest.raises(VisionModelError, match="could not be decoded"):
        run(engine, ask(broken))
    assert run(engine, ask(png("black")))[0]  # and the engine goes on serving


def test_a_card_that_sees_on_a_text_only_folder_fails_to_load(tmp_path):
    from skulk.artifacts.resolve import ensure_local_model

    text_card = load_card(builtin_cards_dir() / "local--tiny-llama.toml")
    path = ensure_local_model(text_card, tmp_path)
    engine = MlxVisionEngine()
    with pytest.raises(ModelLoadFailed, match="no vision_config"):
        engine.load(ShardSpec(instance=local_instance(CARD, 1), runner_id=local_instance(CARD, 1).shards[0].runner_id,
                              card=CARD, model_path=str(path)))


def test_a_vision_folder_of_a_family_the_path_does_not_serve_is_refused_by_name(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "qwen2_vl", "vision_config": {}}')
    instance = local_instance(CARD, 1)
    with pytest.raises(ModelLoadFailed, match="'qwen2_vl' is not a family the MLX vision path serves"):
        MlxVisionEngine().load(ShardSpec(instance=instance, runner_id=instance.shards[0].runner_id, card=CARD,
                                         model_path=str(tmp_path)))


@pytest.mark.parametrize("method", ["ngram", "draft"])
def test_a_speculating_card_is_refused_on_the_vision_path_by_name(method, tmp_path):
    card = CARD.model_copy(update={"runtime": CARD.runtime.model_copy(update={"speculative": method})})
    instance = local_instance(card, 1)
    with pytest.raises(ModelLoadFailed, match=f"does not speculate.*'{method}'"):
        MlxVisionEngine().load(ShardSpec(instance=instance, runner_id=instance.shards[0].runner_id, card=card,
                                         model_path=str(tmp_path)))


# -- pure helpers and the traits table --------------------------------------------------------


@pytest.mark.parametrize(("segments", "want"), [
    ([Segment("plain", False)], [Segment("plain", False)]),
    ([Segment(f"{IMAGE_MARKER}hi", False)], [Segment(IMAGE_TOKEN, True), Segment("hi", False)]),
    ([Segment(f"a{IMAGE_MARKER}b{IMAGE_MARKER}", False)],
     [Segment("a", False), Segment(IMAGE_TOKEN, True), Segment("b", False), Segment(IMAGE_TOKEN, True)]),
    ([Segment(f"<t>{IMAGE_MARKER}", True)], [Segment(f"<t>{IMAGE_MARKER}", True)]),  # template text is left alone
])
def test_image_markers_become_the_image_token(segments, want):
    assert images_as(segments, IMAGE_TOKEN) == want


@pytest.mark.parametrize(("prompt", "blocks", "want"), [
    ([1, 9, 2], [[9, 9, 9]], [1, 9, 9, 9, 2]),  # LLaVA: the image token once per embedding
    ([9, 9], [[9], [9, 9]], [9, 9, 9]),
    ([1, 2], [], [1, 2]),
    ([1, 7, 2], [[5, 7, 8, 8, 6, 5]], [1, 5, 7, 8, 8, 6, 5, 2]),  # Gemma 3: framed soft tokens
    ([7, 7], [[7, 8], [7, 8, 8]], [7, 8, 7, 8, 8]),  # each image its own length
])
def test_placeholders_expand_per_image(prompt, blocks, want):
    assert expanded(prompt, 9 if 9 in prompt else 7, blocks) == want


def test_an_image_without_its_token_is_refused():
    with pytest.raises(VisionModelError, match="1 image token"):
        expanded([1, 9], 9, [[9, 9], [9, 9]])


@pytest.mark.parametrize(("ids", "added", "want"), [
    ([0, 9, 9], [0], [9, 9]),  # the tokenizer's BOS dropped
    ([9, 9], [0], [9, 9]),  # a processor that adds none
    ([0, 5, 9, 6], [], [0, 5, 9, 6]),  # a tokenizer that adds nothing
])
def test_an_images_block_is_the_processors_ids_less_what_the_tokenizer_adds(ids, added, want):
    assert image_block(ids, added) == want


def test_every_served_family_says_how_it_places_images():
    assert frozenset(VISION_FAMILIES) == MLX_VLM_VISION_TYPES


@pytest.mark.parametrize(("vision", "feature", "honoured"), [
    (True, Feature.IMAGES, True),
    (True, Feature.N, True),
    (True, Feature.LOGPROBS, False),
    (True, Feature.STRUCTURED_OUTPUT, False),
    (True, Feature.PENALTIES, False),
    (True, Feature.LOGIT_BIAS, False),
    (False, Feature.IMAGES, False),
    (False, Feature.LOGPROBS, True),
])
def test_mlx_honours_per_path(vision, feature, honoured):
    assert (feature in honoured_features("mlx", vision=vision)) is honoured


def test_logprobs_on_the_vision_path_are_refused_by_name():
    request = ask(png("black"), logprobs=True)
    assert missing_features("mlx", request, vision=True) == [(Feature.LOGPROBS, "logprobs")]
    assert missing_features("mlx", ask(png("black")), vision=True) == []


@pytest.mark.parametrize(("engine", "family", "sees", "on_path"), [
    ("mlx", "llava", True, True),
    ("mlx", "llava", False, False),  # a card that does not say it sees stays on the text path
    ("mlx", "gemma3", True, True),
    ("mlx", "qwen2_5_vl", True, True),
    ("mlx", "qwen2_vl", True, False),  # a family the vision path has not been shown to run
    ("llama_server", "llama", True, False),  # no separate vision path there
])
def test_the_vision_path_is_the_cards_and_the_familys(engine, family, sees, on_path):
    assert on_vision_path(engine, family, sees) is on_path


def test_a_vision_mlx_model_never_spans_nodes():
    assert sees_images("mlx", "llava") and sees_images("mlx", "gemma3") and not sees_images("mlx")
    assert sees_images("mlx", "qwen2_5_vl") and not sees_images("mlx", "qwen2_vl")
    assert not shards_model("mlx", "llava", sees=True) and not shards_model("mlx", "gemma3", sees=True)
    assert shards_model("mlx", "llama", sees=True)  # llama has no vision path: the text path spans
    assert shards_model("mlx", "llama", sees=False)


def test_the_runner_picks_the_vision_engine_for_a_card_that_sees():
    assert engine_factory("mlx-cpu", True).__name__ == "_mlx_vision_engine"  # type: ignore[union-attr]
    assert engine_factory("mlx-cpu", False) is not None
    assert engine_factory("llama_server-cpu", True) is engine_factory("llama_server-cpu", False)
