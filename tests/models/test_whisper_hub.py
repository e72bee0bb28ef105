"""A CTranslate2 Whisper repo (what `Systran/faster-whisper-*` publish) from a (mock) hub:
the selection takes the model directory's top-level files only, the download lands them
where the engine looks, and faster-whisper loads and transcribes what came down."""

from __future__ import annotations

import pytest

from skulk.models.downloads import MARKER_FILE_NAME, download_model
from skulk.models.hub_files import RepoFile, SelectionError, is_ctranslate2_repo, select_files
from skulk.models.tiny_models import ensure_generated
from skulk.shared.types.workload_io import TranscriptionParams
from skulk.worker.engines.base import ShardSpec
from skulk.worker.engines.speech.whisper import WhisperEngine
from tests.mockhub import mock_hub, tiny_artifacts  # noqa: F401 - fixtures
from tests.speech_kit import RUNNER, silent_wav, tiny_whisper_card, whisper_instance

REPO = "mock-org/faster-whisper-tiny"
MODEL_FILES = ["config.json", "model.bin", "preprocessor_config.json", "tokenizer.json", "vocabulary.json"]


def listing(*paths: str) -> list[RepoFile]:
    return [RepoFile(p, 10) for p in paths]


@pytest.mark.parametrize(("paths", "expected"), [
    (("model.bin", "config.json", "vocabulary.txt", "tokenizer.json", "preprocessor_config.json", "README.md",
      ".gitattributes", "pytorch_model.bin.bak/x", "onnx/model.onnx"),
     ("config.json", "model.bin", "preprocessor_config.json", "tokenizer.json", "vocabulary.txt")),
    (("model.bin", "config.json", "vocabulary.json"), ("config.json", "model.bin", "vocabulary.json")),
])
def test_select_ctranslate2_takes_the_model_directory(paths, expected):
    assert select_files(REPO, "ctranslate2", listing(*paths)) == expected
    assert is_ctranslate2_repo(listing(*paths))


@pytest.mark.parametrize(("paths", "message"), [
    (("config.json", "vocabulary.txt"), "no top-level model.bin"),
    (("sub/model.bin", "config.json", "vocabulary.txt"), "no top-level model.bin"),
    (("model.bin", "config.json"), "vocabulary"),
])
def test_select_ctranslate2_refuses_what_is_not_one(paths, message):
    with pytest.raises(SelectionError, match=message):
        select_files(REPO, "ctranslate2", listing(*paths))


def test_a_ctranslate2_repo_downloads_and_transcribes(mock_hub, tmp_path):
    generated = ensure_generated(tiny_whisper_card(), tmp_path / "generated")
    files = {p.name: p.read_bytes() for p in generated.iterdir() if p.name in MODEL_FILES}
    mock_hub.add_repo(REPO, {**files, "README.md": b"# tiny whisper\n", "onnx/encoder.onnx": b"\0" * 512},
                      tags=("ctranslate2", "whisper"))
    card = tiny_whisper_card().model_copy(update={"model_id": REPO, "source": "huggingface", "name": REPO})
    path = download_model(card, tmp_path / "models")
    assert sorted(p.name for p in path.iterdir() if p.name != MARKER_FILE_NAME) == MODEL_FILES

    engine = WhisperEngine()
    engine.load(ShardSpec(instance=whisper_instance(), runner_id=RUNNER, card=card, model_path=str(path), n_threads=1))
    try:
        (result,) = engine.transcribe(TranscriptionParams.of_audio(REPO, silent_wav(1.0)))
        assert result.final and result.duration == pytest.approx(1.0)
    finally:
        engine.close()
