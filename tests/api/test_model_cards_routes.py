"""Model discovery routes through the FastAPI app: search, add (hub repo or local path) and
delete custom cards, against the mock hub over real HTTP. The context's `submit_command`
records the command and applies the master's decision to State, as the cluster would."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from skulk.api.app import ApiContext, create_app
from skulk.models.tiny_models import TINY_SPEC
from skulk.shared.types.commands import AddCustomModelCard, DeleteCustomModelCard
from skulk.shared.types.state import State
from tests.mockhub import (
    GGUF_FILE,
    PRIVATE_REPO,
    TINY_GGUF_REPO,
    TINY_MLX_REPO,
    mock_hub,  # noqa: F401 - fixture
    tiny_artifacts,  # noqa: F401 - fixture
)


class Cluster:
    """Takes commands like the master: card commands change State's custom cards."""

    def __init__(self, connected: bool = True) -> None:
        self.state = State()
        self.commands: list = []
        self.connected = connected

    async def submit(self, command) -> None:
        if not self.connected:
            raise RuntimeError("this node is not connected to a cluster")
        self.commands.append(command)
        cards = dict(self.state.custom_cards)
        if isinstance(command, AddCustomModelCard):
            cards[command.card.model_id] = command.card
        elif isinstance(command, DeleteCustomModelCard):
            cards.pop(command.model_id, None)
        self.state = self.state.model_copy(update={"custom_cards": cards})


def _client(cluster: Cluster, local_dirs=()) -> TestClient:
    context = ApiContext(node_id="node-a", node_name="a", get_state=lambda: cluster.state,
                         submit_command=cluster.submit, get_cards=lambda: dict(cluster.state.custom_cards),
                         local_model_dirs=tuple(local_dirs))
    return TestClient(create_app(context))


def _shape(card: dict) -> tuple:
    return (card["numLayers"], card["hiddenSize"], card["numAttentionHeads"], card["numKeyValueHeads"],
            card["headDim"], card["vocabSize"], card["contextLength"])


TINY_SHAPE = (TINY_SPEC.num_layers, TINY_SPEC.hidden_size, TINY_SPEC.num_attention_heads,
              TINY_SPEC.num_key_value_heads, TINY_SPEC.head_dim, TINY_SPEC.vocab_size, TINY_SPEC.context_length)


def test_search_finds_repos_and_exact_gguf_file_names(mock_hub):
    client = _client(Cluster())
    found = client.get("/models/search", params={"q": "tiny-llama"})
    assert found.status_code == 200, found.text
    by_id = {r["modelId"]: r for r in found.json()["results"]}
    assert {TINY_MLX_REPO, TINY_GGUF_REPO} <= set(by_id)
    assert by_id[TINY_GGUF_REPO]["format"] == "gguf" and by_id[TINY_MLX_REPO]["format"] == "safetensors"

    # The hub's search does not index file names: the bounded fallback finds the repo.
    by_file = client.get("/models/search", params={"query": "tiny-llama-Q8_0.gguf"}).json()
    assert by_file["filenameFallback"] is True
    assert [(r["modelId"], r["matchedFile"]) for r in by_file["results"]] == [(TINY_GGUF_REPO, "tiny-llama-Q8_0.gguf")]

    nothing = client.get("/models/search", params={"q": "no-such-model-anywhere.gguf"}).json()
    assert nothing["results"] == []
    assert client.get("/models/search").status_code == 400


def test_add_gguf_repo_builds_a_llama_cpp_card(mock_hub):
    cluster = Cluster()
    client = _client(cluster)
    added = client.post("/models/add", json={"modelId": TINY_GGUF_REPO})
    assert added.status_code == 200, added.text
    body = added.json()
    assert body["modelId"] == TINY_GGUF_REPO and body["applied"] is True
    card = body["card"]
    assert card["ggufFile"] == GGUF_FILE  # the quant preference: Q4_K_M before Q8_0
    assert card["quantization"] == "Q4_K_M"
    assert "llama_cpp" in card["placement"]["compatibleBackends"]
    assert _shape(card) == TINY_SHAPE  # from the GGUF header, read with a Range request
    assert isinstance(cluster.commands[0], AddCustomModelCard)
    assert cluster.state.custom_cards[TINY_GGUF_REPO].gguf_file == GGUF_FILE

    # Another quant of the same repo replaces the card only when asked to.
    refused = client.post("/models/add", json={"modelId": TINY_GGUF_REPO, "ggufFile": "tiny-llama-Q8_0.gguf"})
    assert refused.status_code == 409 and refused.json()["code"] == "card_exists"
    assert cluster.state.custom_cards[TINY_GGUF_REPO].gguf_file == GGUF_FILE
    pinned = client.post("/models/add", json={"modelId": TINY_GGUF_REPO, "ggufFile": "tiny-llama-Q8_0.gguf",
                                              "override": True}).json()
    assert pinned["card"]["ggufFile"] == "tiny-llama-Q8_0.gguf" and pinned["card"]["quantization"] == "Q8_0"


def test_add_safetensors_repo_builds_an_mlx_card_with_a_revision_pin(mock_hub):
    cluster = Cluster()
    client = _client(cluster)
    card = client.post("/models/add", json={"modelId": TINY_MLX_REPO}).json()["card"]
    assert card["placement"]["compatibleBackends"][0] == "mlx"
    assert card["ggufFile"] is None and card["sourceRevision"] is None
    assert _shape(card) == TINY_SHAPE and card["quantization"] == "f32"
    # Counted from the safetensors header, read through the hub with a Range request.
    assert card["totalParameters"] == card["activeParameters"] == TINY_SPEC.parameter_count

    main = mock_hub.repos[TINY_MLX_REPO].main
    pinned = client.post("/models/add", json={"modelId": TINY_MLX_REPO, "revision": "main",
                                              "override": True}).json()["card"]
    assert pinned["sourceRevision"] == main  # a branch name resolves to the commit it names


def test_an_mlx_card_reads_the_models_own_chat_template(mock_hub, tiny_artifacts, tmp_path):
    """The hub repo's and the local folder's tokenizer_config.json template decides the
    reasoning format, its switches and the tool-call format, as a GGUF's does."""
    import json
    import shutil

    template = json.dumps({"chat_template": "{% if enable_thinking %}<think></think>{% endif %}<tool_call>"})
    files = {p.name: p.read_bytes() for p in tiny_artifacts.hf_dir.iterdir() if p.is_file()}
    mock_hub.add_repo("mock-org/thinking-mlx", {**files, "tokenizer_config.json": template.encode()},
                      tags=("mlx", "safetensors"))
    folder = tmp_path / "thinking"
    shutil.copytree(tiny_artifacts.hf_dir, folder)
    (folder / "tokenizer_config.json").write_text(template)
    client = _client(Cluster(), [tmp_path])
    for body in ({"modelId": "mock-org/thinking-mlx"}, {"path": str(folder)}):
        reply = client.post("/models/add", json=body)
        assert reply.status_code == 200, reply.text
        card = reply.json()["card"]
        assert (card["reasoning"]["format"], card["reasoning"]["switches"]) == ("think_tags", ["enable_thinking"])
        assert card["tooling"]["toolCallFormat"] == "hermes" and "thinking" in card["capabilities"]


@pytest.fixture(scope="module")
def speech_files(tmp_path_factory) -> dict[str, dict[str, bytes]]:
    """The generated tiny Whisper (CTranslate2) and tiny Piper voice, as repo files."""
    from skulk.models.tiny_piper import write_tiny_piper
    from skulk.models.tiny_whisper import write_tiny_whisper

    out = {}
    for kind, write in (("whisper", write_tiny_whisper), ("piper", write_tiny_piper)):
        folder = tmp_path_factory.mktemp(kind)
        write(folder)
        out[kind] = {p.name: p.read_bytes() for p in sorted(folder.iterdir())}
    return out


def test_a_ctranslate2_whisper_repo_builds_a_transcription_card(mock_hub, speech_files):
    mock_hub.add_repo("mock-org/faster-whisper-tiny", {**speech_files["whisper"], "README.md": b"# w\n"},
                      tags=("ctranslate2",))
    cluster = Cluster()
    added = _client(cluster).post("/models/add", json={"modelId": "mock-org/faster-whisper-tiny"})
    assert added.status_code == 200, added.text
    card = added.json()["card"]
    # The decoder's shape, read from model.bin's variable records (2 layers, 2 heads of 32).
    assert _shape(card) == (2, 64, 2, 2, 32, 2626, 448)
    assert (card["family"], card["tasks"], card["capabilities"]) == ("whisper", ["Transcription"], ["stt"])
    assert "faster_whisper" in card["placement"]["compatibleBackends"]
    audio = card["audio"]
    assert audio["sampleRate"] == 16000 and audio["supportsTranslation"] is True
    assert {"en", "de", "ja", "yue"} <= set(audio["languages"]) and len(audio["languages"]) == 100
    size = sum(len(v) for k, v in speech_files["whisper"].items())
    assert card["storageSizeBytes"] == size  # every file faster-whisper loads, not the README
    # model.bin's weights were never read: only its header and the records after the layers.
    reads = [r for r in mock_hub.requests if r.path.endswith("/model.bin")]
    assert reads and all(r.range is not None for r in reads)


@pytest.mark.parametrize(("drop", "garble", "says"), [
    ("tokenizer.json", None, "needs tokenizer.json"),
    ("vocabulary.json", None, "vocabulary.json or vocabulary.txt"),
    (None, "model.bin", "model.bin: CTranslate2 format version"),
])
def test_a_ctranslate2_repo_that_cannot_be_served_is_refused_naming_what_is_missing(mock_hub, speech_files, drop,
                                                                                     garble, says):
    files = {k: (b"\0" * 64 if k == garble else v) for k, v in speech_files["whisper"].items() if k != drop}
    mock_hub.add_repo("mock-org/faster-whisper-broken", files, tags=("ctranslate2",))
    cluster = Cluster()
    refused = _client(cluster).post("/models/add", json={"modelId": "mock-org/faster-whisper-broken"})
    assert refused.status_code == 400 and says in refused.json()["detail"], refused.text
    assert cluster.commands == []


def test_a_piper_voice_repo_builds_a_speech_card_for_the_named_voice(mock_hub, speech_files):
    voice = speech_files["piper"]
    mock_hub.add_repo("mock-org/piper-voices", {
        "en/en_US/tiny/x_low/en_US-tiny-x_low.onnx": voice["model.onnx"],
        "en/en_US/tiny/x_low/en_US-tiny-x_low.onnx.json": voice["model.onnx.json"],
        "de/de_DE/tiny/x_low/de_DE-tiny-x_low.onnx": voice["model.onnx"],
        "de/de_DE/tiny/x_low/de_DE-tiny-x_low.onnx.json": voice["model.onnx.json"],
        "voices.json": b"{}"}, tags=("onnx",))
    client = _client(Cluster())
    unnamed = client.post("/models/add", json={"modelId": "mock-org/piper-voices"})
    assert unnamed.status_code == 400 and "holds 2 Piper voices" in unnamed.json()["detail"]
    assert "onnxFile" in unnamed.json()["detail"]
    chosen = "en/en_US/tiny/x_low/en_US-tiny-x_low.onnx"
    added = client.post("/models/add", json={"modelId": "mock-org/piper-voices", "onnxFile": chosen})
    assert added.status_code == 200, added.text
    card = added.json()["card"]
    assert (card["onnxFile"], card["family"], card["tasks"], card["capabilities"]) == (
        chosen, "vits", ["SpeechSynthesis"], ["tts"])
    assert card["audio"]["voices"] == ["amber", "birch", "cedar"] and card["audio"]["defaultVoice"] == "amber"
    assert card["audio"]["sampleRate"] == 22050 and card["audio"]["languages"] == ["en"]
    assert card["storageSizeBytes"] == len(voice["model.onnx"]) + len(voice["model.onnx.json"])
    wrong = client.post("/models/add", json={"modelId": "mock-org/piper-voices", "onnxFile": "x/none.onnx",
                                             "override": True})
    assert wrong.status_code == 400 and "x/none.onnx" in wrong.json()["detail"]
    bad = client.post("/models/add", json={"modelId": "mock-org/piper-voices", "onnxFile": "/abs.onnx"})
    assert bad.status_code == 400 and bad.json()["param"] == "onnxFile"


def test_an_onnx_without_its_config_is_refused_naming_it(mock_hub, speech_files):
    mock_hub.add_repo("mock-org/piper-bare", {"v.onnx": speech_files["piper"]["model.onnx"]}, tags=("onnx",))
    refused = _client(Cluster()).post("/models/add", json={"modelId": "mock-org/piper-bare"})
    assert refused.status_code == 400 and "v.onnx has no .onnx.json" in refused.json()["detail"]


def test_add_errors_are_typed(mock_hub):
    client = _client(Cluster())
    missing = client.post("/models/add", json={"modelId": "mock-org/nope"})
    assert missing.status_code == 404 and missing.json()["code"] == "hub_not_found"
    private = client.post("/models/add", json={"modelId": PRIVATE_REPO})
    assert private.status_code == 400 and private.json()["code"] == "hub_unauthorized"
    assert "HF_TOKEN" in private.json()["detail"]
    no_quant = client.post("/models/add", json={"modelId": TINY_GGUF_REPO, "ggufFile": "nope.gguf"})
    assert no_quant.status_code == 400 and "nope.gguf" in no_quant.json()["detail"]
    no_voice = client.post("/models/add", json={"modelId": TINY_MLX_REPO, "onnxFile": "voice.onnx"})
    assert no_voice.status_code == 400 and "no voice.onnx or voice.onnx.json" in no_voice.json()["detail"]
    assert client.post("/models/add", json={}).status_code == 400
    assert client.post("/models/add", json={"modelId": "local/x"}).status_code == 400

    offline = _client(Cluster(connected=False)).post("/models/add", json={"modelId": TINY_MLX_REPO})
    assert offline.status_code == 503 and offline.json()["code"] == "cluster_not_ready"


def test_add_local_paths(tiny_artifacts, tmp_path):
    cluster = Cluster()
    client = _client(cluster, [tiny_artifacts.gguf_path.parent, tiny_artifacts.hf_dir, tmp_path])
    gguf = client.post("/models/add", json={"path": str(tiny_artifacts.gguf_path)})
    assert gguf.status_code == 200, gguf.text
    card = gguf.json()["card"]
    assert gguf.json()["modelId"] == "local/model"
    assert card["source"] == "local-path" and card["localPath"] == str(tiny_artifacts.gguf_path.parent)
    assert card["ggufFile"] == "model.gguf" and _shape(card) == TINY_SHAPE

    mlx = client.post("/models/add", json={"path": str(tiny_artifacts.hf_dir), "modelId": "local/my-tiny"}).json()
    assert mlx["modelId"] == "local/my-tiny" and mlx["card"]["placement"]["compatibleBackends"][0] == "mlx"
    assert set(cluster.state.custom_cards) == {"local/model", "local/my-tiny"}

    assert client.post("/models/add", json={"path": "relative/dir"}).status_code == 400
    assert client.post("/models/add", json={"path": str(tmp_path / "absent")}).status_code == 404
    (tmp_path / "empty").mkdir()
    assert client.post("/models/add", json={"path": str(tmp_path / "empty")}).status_code == 400


def test_delete_custom_card(tiny_artifacts):
    cluster = Cluster()
    client = _client(cluster, [tiny_artifacts.gguf_path.parent])
    client.post("/models/add", json={"path": str(tiny_artifacts.gguf_path)})
    deleted = client.delete("/models/custom/local/model")
    assert deleted.status_code == 200 and deleted.json() == {"modelId": "local/model", "deleting": True}
    assert isinstance(cluster.commands[-1], DeleteCustomModelCard)
    assert "local/model" not in cluster.state.custom_cards
    gone = client.delete("/models/custom/local/model")
    assert gone.status_code == 404 and gone.json()["code"] == "unknown_card"
