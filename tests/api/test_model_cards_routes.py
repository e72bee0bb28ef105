"""Model discovery routes through the FastAPI app: search, add (hub repo or local path) and
delete custom cards, against the mock hub over real HTTP. The context's `submit_command`
records the command and applies the master's decision to State, as the cluster would."""

from __future__ import annotations

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


def test_a_ctranslate2_repo_is_refused_with_the_way_to_add_it(mock_hub):
    """A faster-whisper repo's small files hold no model shape: no card is guessed."""
    mock_hub.add_repo("mock-org/faster-whisper-x", {"model.bin": b"\0" * 64, "config.json": b'{"lang_ids": []}',
                                                    "vocabulary.json": b"[]"}, tags=("ctranslate2",))
    cluster = Cluster()
    refused = _client(cluster).post("/models/add", json={"modelId": "mock-org/faster-whisper-x"})
    assert refused.status_code == 400 and "CTranslate2" in refused.json()["detail"]
    assert "Systran--faster-whisper-small.toml" in refused.json()["detail"] and cluster.commands == []


def test_add_errors_are_typed(mock_hub):
    client = _client(Cluster())
    missing = client.post("/models/add", json={"modelId": "mock-org/nope"})
    assert missing.status_code == 404 and missing.json()["code"] == "hub_not_found"
    private = client.post("/models/add", json={"modelId": PRIVATE_REPO})
    assert private.status_code == 400 and private.json()["code"] == "hub_unauthorized"
    assert "HF_TOKEN" in private.json()["detail"]
    no_quant = client.post("/models/add", json={"modelId": TINY_GGUF_REPO, "ggufFile": "nope.gguf"})
    assert no_quant.status_code == 400 and "nope.gguf" in no_quant.json()["detail"]
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
