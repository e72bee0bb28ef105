"""The generated vision model (local/tiny-vlm-gguf): the projector GGUF holds what llama.cpp's
`clip` loader reads for a LLaVA `mlp` projector (metadata keys, tensor names and shapes, an
output dim equal to the LM's embedding size), is deterministic, and is generated beside the
model by the node's own resolution path. That llama-server loads it and sees images through
it: tests/worker/engines/served/test_llama_server_vision.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from skulk.artifacts.resolve import ensure_local_model
from skulk.models.cards import builtin_cards_dir, load_card
from skulk.models.companions import projector_path
from skulk.models.tiny_models import (
    GGUF_FILE_NAME,
    PROJECTOR_FILE_NAME,
    TINY_SPEC,
    TINY_VISION_SPEC,
    _write_mmproj,  # pyright: ignore[reportPrivateUsage] -- determinism of the writer alone
    spec_hash,
)

VLM_CARD = load_card(builtin_cards_dir() / "local--tiny-vlm-gguf.toml")


@pytest.fixture(scope="module")
def generated(tmp_path_factory) -> tuple[Path, Path]:
    model = ensure_local_model(VLM_CARD, tmp_path_factory.mktemp("models"))
    return model, model.parent / PROJECTOR_FILE_NAME


def _field(reader, key: str):
    field = reader.fields[key]
    value = field.contents()
    return value


def test_the_node_generates_the_model_and_its_projector_side_by_side(generated):
    model, projector = generated
    assert model.name == GGUF_FILE_NAME and projector.is_file()
    assert projector_path(VLM_CARD, {}, str(model)) == str(projector)
    assert "vision" in VLM_CARD.capabilities and VLM_CARD.vision_weights_repo is None
    # Placement fits memory with the card's sizes: each within 5% of its file (the projector
    # is admitted on rank 0 beside the model's share).
    for stated, path in ((VLM_CARD.storage_size_bytes, model), (VLM_CARD.vision_weights_size_bytes, projector)):
        assert stated is not None and abs(stated - path.stat().st_size) <= path.stat().st_size * 0.05


def test_the_projector_carries_llavas_mlp_metadata(generated):
    gguf = pytest.importorskip("gguf")
    reader = gguf.GGUFReader(str(generated[1]))
    assert _field(reader, "general.architecture") == "clip"
    assert _field(reader, "clip.has_vision_encoder") is True
    assert _field(reader, "clip.projector_type") == "mlp"
    expected = {
        "clip.vision.image_size": TINY_VISION_SPEC.image_size,
        "clip.vision.patch_size": TINY_VISION_SPEC.patch_size,
        "clip.vision.embedding_length": TINY_VISION_SPEC.hidden_size,
        "clip.vision.feed_forward_length": TINY_VISION_SPEC.intermediate_size,
        "clip.vision.block_count": TINY_VISION_SPEC.num_layers,
        "clip.vision.attention.head_count": TINY_VISION_SPEC.num_attention_heads,
        "clip.vision.projection_dim": TINY_SPEC.hidden_size,
    }
    assert {key: _field(reader, key) for key in expected} == expected


def test_the_projectors_tensors_map_patches_into_the_lms_embedding(generated):
    gguf = pytest.importorskip("gguf")
    shapes = {t.name: tuple(int(n) for n in t.shape) for t in gguf.GGUFReader(str(generated[1])).tensors}
    h, lm, p = TINY_VISION_SPEC.hidden_size, TINY_SPEC.hidden_size, TINY_VISION_SPEC.patch_size
    # ggml's ne order: the input dimension first.
    assert shapes["v.patch_embd.weight"] == (p, p, 3, h)
    assert shapes["v.position_embd.weight"] == (h, TINY_VISION_SPEC.image_tokens + 1)
    assert shapes["v.class_embd"] == (h,)
    assert shapes["mm.0.weight"] == (h, lm) and shapes["mm.2.weight"] == (lm, lm)
    assert shapes["mm.2.bias"] == (lm,)
    blocks = {name.split(".")[2] for name in shapes if name.startswith("v.blk.")}
    assert blocks == {str(i) for i in range(TINY_VISION_SPEC.num_layers)}
    assert shapes["v.blk.0.ffn_up.weight"] == (h, TINY_VISION_SPEC.intermediate_size)


def test_the_projector_is_deterministic(tmp_path, generated):
    again = tmp_path / "again.gguf"
    _write_mmproj(again, TINY_VISION_SPEC, TINY_SPEC.hidden_size)
    assert again.read_bytes() == generated[1].read_bytes()


def test_the_projector_is_part_of_the_models_identity():
    assert spec_hash(TINY_SPEC, TINY_VISION_SPEC) != spec_hash(TINY_SPEC)
