"""Piper voices from the hub: a repo like rhasspy/piper-voices holds hundreds of voices, so an
ONNX card names its file (`onnx_file`), and exactly that file and its `.onnx.json` are
downloaded. Card rules and file selection as tables; then the real download path against a
mock hub publishing the generated voice among others, and the engine speaking with what it
downloaded."""

from __future__ import annotations

import base64

import pytest
from pydantic import ValidationError

from skulk.models.cards import builtin_cards_dir, load_card
from skulk.models.downloads import download_model, local_artifact
from skulk.models.hub_files import RepoFile, SelectionError, select_files
from skulk.models.tiny_piper import CONFIG_FILE, MODEL_FILE, write_tiny_piper
from skulk.shared.types.cards import ModelCard
from skulk.shared.types.ids import ModelId
from skulk.shared.types.workload_io import SpeechParams
from skulk.worker.engines.base import ShardSpec
from skulk.worker.engines.speech.piper_voice import PiperEngine
from tests.mockhub import MockHub, serve
from tests.worker.tiny_gguf import RUNNER, tiny_instance

REPO = "mock-org/piper-voices"
VOICE = "en/en_US/tiny/x_low/en_US-tiny-x_low.onnx"
OTHER = "de/de_DE/other/low/de_DE-other-low.onnx"
TINY = load_card(builtin_cards_dir() / "local--tiny-piper.toml")


def voice_card(**fields) -> ModelCard:
    """The tiny voice's card as a hub card of `REPO` (fields override)."""
    data = TINY.model_dump()
    data.update({"model_id": REPO, "source": "huggingface", "onnx_file": VOICE, **fields})
    return ModelCard.model_validate(data)


def test_the_builtin_hub_voice_names_its_file():
    card = load_card(builtin_cards_dir() / "rhasspy--piper-voices.toml")
    assert card.artifact_format == "onnx" and card.onnx_file == "en/en_US/lessac/medium/en_US-lessac-medium.onnx"
    assert card.audio is not None and card.audio.voices == ("lessac",) and card.audio.sample_rate == 22050


@pytest.mark.parametrize(("fields", "words"), [
    ({"onnx_file": None}, "required for an ONNX card from the hub"),
    ({"onnx_file": "/abs/voice.onnx"}, "repo-relative path ending in .onnx"),
    ({"onnx_file": "../voice.onnx"}, "repo-relative path ending in .onnx"),
    ({"onnx_file": "voice.onnx.json"}, "ending in .onnx"),
    ({"model_id": "local/tiny-piper", "source": "local-generated"}, "generator's to name"),
])
def test_card_rules_for_onnx_file(fields, words):
    with pytest.raises(ValidationError, match=words.replace(".", r"\.")):
        voice_card(**fields)


def test_onnx_file_is_refused_on_a_card_of_another_format():
    gguf = load_card(builtin_cards_dir() / "local--tiny-llama-gguf.toml").model_dump()
    gguf.update(model_id="mock-org/x-GGUF", source="huggingface", gguf_file="x.gguf", onnx_file=VOICE)
    with pytest.raises(ValidationError, match="do not load ONNX"):
        ModelCard.model_validate(gguf)


LISTING = [RepoFile(p, 10) for p in (VOICE, f"{VOICE}.json", OTHER, f"{OTHER}.json", "README.md", "voices.json")]


@pytest.mark.parametrize(("onnx_file", "listing", "selected"), [
    (VOICE, LISTING, (VOICE, f"{VOICE}.json")),
    (OTHER, LISTING, (OTHER, f"{OTHER}.json")),
    (VOICE, [f for f in LISTING if f.path != f"{VOICE}.json"], "no '" + VOICE + ".json'"),
    ("missing.onnx", LISTING, "no 'missing.onnx' or 'missing.onnx.json'"),
    (None, LISTING, "names its voice's file"),
])
def test_an_onnx_card_selects_its_voice_and_config_only(onnx_file, listing, selected):
    if isinstance(selected, tuple):
        assert select_files(REPO, "onnx", listing, onnx_file=onnx_file) == selected
    else:
        with pytest.raises(SelectionError, match=selected.replace(".", r"\.")):
            select_files(REPO, "onnx", listing, onnx_file=onnx_file)


@pytest.fixture
def voice_hub(tmp_path, monkeypatch):
    """A mock hub whose REPO publishes the generated voice under VOICE, among other files."""
    written = tmp_path / "voice"
    written.mkdir()
    write_tiny_piper(written)
    model, config = (written / MODEL_FILE).read_bytes(), (written / CONFIG_FILE).read_bytes()
    hub = MockHub()
    hub.add_repo(REPO, {VOICE: model, f"{VOICE}.json": config, OTHER: b"\0" * 4096, f"{OTHER}.json": b"{}",
                        "README.md": b"# voices\n"})
    with serve(hub):
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        monkeypatch.delenv("HF_TOKEN", raising=False)
        monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        yield hub


def test_a_hub_voice_downloads_its_two_files_and_speaks(voice_hub, tmp_path):
    card = voice_card()
    path = download_model(card, tmp_path / "models")
    assert path.name == "en_US-tiny-x_low.onnx" and path.as_posix().endswith(VOICE)
    downloaded = sorted(p.relative_to(path.parents[4]).as_posix() for p in path.parents[4].rglob("*")
                        if p.is_file() and not p.name.startswith(".") and "skulk" not in p.name)
    assert downloaded == [VOICE, f"{VOICE}.json"]
    assert not voice_hub.file_requests(OTHER)  # the other voice was never fetched
    assert local_artifact(card, tmp_path / "models") == path  # a complete copy is reused

    engine = PiperEngine()
    engine.load(ShardSpec(tiny_instance(card, backend="piper-cpu"), RUNNER, card, str(path)))
    [result] = engine.synthesize(SpeechParams(model_id=ModelId(REPO), input="Hello from the hub.", voice="birch"))
    assert len(base64.b64decode(result.pcm16_b64)) > 0
