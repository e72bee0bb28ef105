"""An mlx-whisper repo (what `mlx-community/whisper-*-mlx` publish) from a (mock) hub: the
selection takes config.json and the one weight file mlx-whisper reads, the download lands
them where the engine looks, and the mlx_whisper engine loads and transcribes what came
down."""

from __future__ import annotations

import pytest

from skulk.models.downloads import MARKER_FILE_NAME, download_model
from skulk.models.hub_files import RepoFile, SelectionError, is_mlx_whisper_repo, select_files
from skulk.models.tiny_models import ensure_generated
from skulk.shared.types.workload_io import TranscriptionParams
from skulk.worker.engines.base import ShardSpec
from tests.mockhub import mock_hub, tiny_artifacts  # noqa: F401 - fixtures
from tests.speech_kit import RUNNER, silent_wav
from tests.speech_kit import mlx_whisper_instance as instance
from tests.speech_kit import tiny_mlx_whisper_card as tiny_card

REPO = "mock-org/whisper-tiny-mlx"


def listing(*paths: str) -> list[RepoFile]:
    return [RepoFile(p, 10) for p in paths]


@pytest.mark.parametrize(("paths", "expected"), [
    (("config.json", "weights.safetensors", "README.md", ".gitattributes"), ("config.json", "weights.safetensors")),
    (("config.json", "weights.npz"), ("config.json", "weights.npz")),
    # Both: the one mlx-whisper's load_model reads first.
    (("config.json", "weights.npz", "weights.safetensors"), ("config.json", "weights.safetensors")),
])
def test_select_mlx_whisper_takes_config_and_one_weight_file(paths, expected):
    assert select_files(REPO, "mlx_whisper", listing(*paths)) == expected
    assert is_mlx_whisper_repo(listing(*paths))


@pytest.mark.parametrize(("paths", "message"), [
    (("weights.safetensors",), "no top-level config.json"),
    (("config.json", "model.safetensors"), "no top-level weights.safetensors or weights.npz"),
    (("config.json", "sub/weights.npz"), "no top-level weights.safetensors or weights.npz"),
])
def test_select_mlx_whisper_refuses_what_is_not_one(paths, message):
    with pytest.raises(SelectionError, match=message):
        select_files(REPO, "mlx_whisper", listing(*paths))


def test_an_mlx_whisper_repo_downloads_and_transcribes(mock_hub, tmp_path):
    pytest.importorskip("mlx_whisper", reason="mlx-whisper is not installed (the dev group installs it)")
    from skulk.worker.engines.speech.mlx_whisper_engine import MlxWhisperEngine

    generated = ensure_generated(tiny_card(), tmp_path / "generated")
    files = {p.name: p.read_bytes() for p in generated.iterdir() if p.name in ("config.json", "weights.safetensors")}
    mock_hub.add_repo(REPO, {**files, "README.md": b"# tiny whisper\n"}, tags=("mlx", "whisper"))
    card = tiny_card().model_copy(update={"model_id": REPO, "source": "huggingface", "name": REPO})
    path = download_model(card, tmp_path / "models")
    assert sorted(p.name for p in path.iterdir() if p.name != MARKER_FILE_NAME) == ["config.json", "weights.safetensors"]

    engine = MlxWhisperEngine()
    engine.load(ShardSpec(instance=instance(), runner_id=RUNNER, card=card, model_path=str(path), n_threads=1))
    try:
        (result,) = engine.transcribe(TranscriptionParams.of_audio(REPO, silent_wav(1.0), language="en"))
        assert result.final and result.duration == pytest.approx(1.0)
    finally:
        engine.close()


def test_no_text_card_is_built_from_an_mlx_whisper_repo(mock_hub):
    from skulk.models.card_builder import CardBuildError
    from skulk.models.downloads import HubSource
    from skulk.models.hub_cards import card_from_hub

    mock_hub.add_repo(REPO, {"config.json": b'{"n_mels": 80}', "weights.npz": b"\0" * 64}, tags=("mlx", "whisper"))
    with pytest.raises(CardBuildError, match="an mlx-whisper repository"):
        card_from_hub(REPO, HubSource.from_env())
