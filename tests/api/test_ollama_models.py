"""Ollama's model management and request quirks: bodies without a JSON Content-Type are
read as JSON; `pull` fetches into the store with Ollama's NDJSON progress; `delete` removes
the weights; `copy`/`create`/`push` say what Skulk does instead; `keep_alive: 0` is
refused; `num_ctx` is honoured per request, clamped to the placed context and said."""

from __future__ import annotations

import json

import httpx
import ollama
import openai
import pytest

from skulk.api.adapters.ollama import CONTEXT_HEADER, clamp_context, keep_alive_seconds
from skulk.api.app import ApiContext, create_app
from skulk.api.errors import InvalidRequest
from skulk.model_store.node_store import NodeStore
from skulk.shared.types.commands import EvictStagedModel
from skulk.shared.types.state import State
from skulk.shared.types.tasks import TextGenerationParams
from tests.api.scripted_cluster import asgi_http, scripted_app
from tests.api.test_openai_routes import MODEL
from tests.api.test_tools_sdk import ollama_sdk
from tests.mockhub import (
    GGUF_FILE,
    TINY_GGUF_REPO,
    hub_card,
    mock_hub,  # noqa: F401 - fixture
    tiny_artifacts,  # noqa: F401 - fixture
)

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": False}


@pytest.mark.parametrize("content_type", [None, "application/x-www-form-urlencoded", "text/plain"])
async def test_a_body_sent_without_a_json_content_type_is_read_as_json(content_type):
    app, _ = scripted_app(["Hi"])
    headers = {} if content_type is None else {"Content-Type": content_type}
    async with asgi_http(app) as http:
        reply = await http.post("/ollama/api/chat", content=json.dumps(CHAT).encode(), headers=headers)
        broken = await http.post("/ollama/api/chat", content=b"{not json", headers=headers)
    assert reply.status_code == 200 and reply.json()["message"]["content"] == "Hi"
    assert broken.status_code == 400 and "error" in broken.json()


@pytest.mark.parametrize("operation", ["copy", "create", "push"])
async def test_operations_without_an_equivalent_say_what_skulk_does_instead(operation):
    app, _ = scripted_app()
    async with asgi_http(app) as http:
        reply = await http.post(f"/ollama/api/{operation}", json={"model": MODEL, "source": "a", "destination": "b"})
    assert reply.status_code == 400
    assert "not supported by Skulk" in reply.json()["error"]
    assert ("/models/add" if operation != "push" else "/ollama/api/pull") in reply.json()["error"]


@pytest.mark.parametrize(("value", "seconds"), [
    (None, None), ("5m", 300.0), (-1, -1.0), ("-1", -1.0), ("-5m", -1.0), (300, 300.0), (0, 0.0), ("0", 0.0),
    ("0s", 0.0), ("1h30m", 5400.0), ("1.5s", 1.5), ("250ms", 0.25),
])
def test_keep_alive_becomes_the_runners_idle_ttl(value, seconds):
    assert keep_alive_seconds(value) == seconds


@pytest.mark.parametrize("value", ["soon", "5 minutes", "m", True, "1x", float("nan"), float("inf")])
def test_a_keep_alive_that_is_no_duration_is_refused(value):
    with pytest.raises(InvalidRequest) as caught:
        keep_alive_seconds(value)
    assert caught.value.param == "keep_alive"


@pytest.mark.parametrize(("asked", "sent", "said"), [(None, None, None), (512, 512, None), (4096, 2048, 2048)])
def test_num_ctx_is_clamped_to_the_placed_context(asked, sent, said):
    params = TextGenerationParams(model_id=MODEL, prompt="x", context_tokens=asked)
    clamped, told = clamp_context(params, 2048)
    assert (clamped.context_tokens, told) == (sent, said)


async def test_num_ctx_reaches_the_runner_and_a_clamp_is_said():
    app, cluster = scripted_app(["Hi"])
    async with asgi_http(app) as http:
        small = await http.post("/ollama/api/chat", json={**CHAT, "options": {"num_ctx": 256}})
        large = await http.post("/ollama/api/chat", json={**CHAT, "options": {"num_ctx": 100000}})
        streamed = await http.post("/ollama/api/chat", json={**CHAT, "stream": True, "options": {"num_ctx": 100000}})
        unload = await http.post("/ollama/api/chat", json={**CHAT, "keep_alive": "2m"})
        bad = await http.post("/ollama/api/chat", json={**CHAT, "keep_alive": "later"})
    assert small.status_code == 200 and CONTEXT_HEADER not in small.headers
    assert large.headers[CONTEXT_HEADER] == "2048" and streamed.headers[CONTEXT_HEADER] == "2048"
    assert [p.context_tokens for p in cluster.all_params()][:3] == [256, 2048, 2048]
    # keep_alive reaches the runner as its idle TTL (seconds); a non-duration is a 400.
    assert unload.status_code == 200 and cluster.all_params()[3].keep_alive_s == 120.0
    assert bad.status_code == 400 and "keep_alive" in bad.json()["error"]


def store_app(tmp_path, cards, commands):
    node_store = NodeStore(staging_root=tmp_path / "staging", canonical_root=tmp_path / "models",
                           free_bytes=lambda _p: 10**15)

    async def submit(command):
        commands.append(command)

    context = ApiContext(node_id="a", node_name="a", get_state=State, get_cards=lambda: cards, store=node_store,
                         submit_command=submit)
    return create_app(context)


async def test_pull_fetches_into_the_store_with_ollama_progress_then_delete_removes_it(tmp_path, mock_hub):
    card = hub_card(TINY_GGUF_REPO, gguf_file=GGUF_FILE)
    commands: list = []
    app = store_app(tmp_path, {card.model_id: card}, commands)
    local = ollama_sdk(app)
    progress = [part async for part in await local.pull(TINY_GGUF_REPO, stream=True)]
    assert progress[0].status == "pulling manifest" and progress[-1].status == "success"
    last = [p for p in progress if p.status.startswith("pulling ") and p.total][-1]
    assert last.completed == last.total > 0
    assert any((tmp_path / "models").rglob(GGUF_FILE))

    assert (await local.pull(TINY_GGUF_REPO, stream=False)).status == "success"  # already there: at once

    await local.delete(TINY_GGUF_REPO)
    assert not any((tmp_path / "models").rglob(GGUF_FILE))
    assert [type(c) for c in commands] == [EvictStagedModel]
    with pytest.raises(ollama.ResponseError) as gone:
        await local.delete(TINY_GGUF_REPO)
    assert gone.value.status_code == 404


async def test_pull_of_a_model_without_a_card_is_an_ollama_404(tmp_path, mock_hub):
    # No card, and the hub has no such repo to build one from.
    app = store_app(tmp_path, {}, [])
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://skulk") as http:
        reply = await http.post("/ollama/api/pull", json={"model": "acme/unknown"})
    assert reply.status_code == 404 and "acme/unknown" in reply.json()["error"]


@pytest.mark.parametrize(("option", "says"), [
    ({"mirostat": 2}, "not supported"), ({"typical_p": 0.9}, "not supported"), ({"num_gpu": 10}, "placement"),
    ({"num_thread": 4}, "placement"),
])
async def test_an_option_skulk_does_not_honour_is_refused(option, says):
    app, cluster = scripted_app(["Hi"])
    async with asgi_http(app) as http:
        reply = await http.post("/ollama/api/chat", json={**CHAT, "options": {"temperature": 0, **option}})
    assert reply.status_code == 400 and says in reply.json()["error"]
    assert f"options.{next(iter(option))}" in reply.json()["error"] and not cluster.commands


LIBRARY_REPO = "bartowski/Llama-3.2-1B-Instruct-GGUF"
"""Where resources/ollama_library.toml maps llama3.2:1b."""


def publish_library_repo(hub, artifacts) -> None:
    gguf = artifacts.gguf_path.read_bytes()
    hub.add_repo(LIBRARY_REPO, {"Llama-3.2-1B-Instruct-Q4_K_M.gguf": gguf, "Llama-3.2-1B-Instruct-Q8_0.gguf": gguf,
                                "README.md": b"# mock\n"}, tags=("gguf", "llama"))


def master_store_app(tmp_path, cards: dict, commands: list):
    """store_app whose submit also plays the master for AddCustomModelCard (the card applies)."""
    from skulk.shared.types.commands import AddCustomModelCard

    class Recorder(list):
        def append(self, command) -> None:
            if isinstance(command, AddCustomModelCard):
                cards[command.card.model_id] = command.card
            super().append(command)

    recorder = Recorder()
    app = store_app(tmp_path, cards, recorder)
    return app, recorder


async def test_pull_of_an_ollama_name_adds_the_mapped_card_and_downloads_its_file(tmp_path, mock_hub, tiny_artifacts):
    publish_library_repo(mock_hub, tiny_artifacts)
    cards: dict = {}
    app, commands = master_store_app(tmp_path, cards, [])
    reply = await ollama_sdk(app).pull("llama3.2:1b", stream=False)
    assert reply.status == "success"
    card = cards[LIBRARY_REPO]
    assert card.gguf_file == "Llama-3.2-1B-Instruct-Q4_K_M.gguf" and card.family == "llama"
    assert [p.name for p in (tmp_path / "models").rglob("*.gguf")] == ["Llama-3.2-1B-Instruct-Q4_K_M.gguf"]
    # pulled again under its repo id: the card is there, nothing is added twice
    assert (await ollama_sdk(app).pull(LIBRARY_REPO, stream=False)).status == "success"
    assert len(commands) == 1


async def test_pull_of_repo_colon_quant_picks_that_quant(tmp_path, mock_hub, tiny_artifacts):
    publish_library_repo(mock_hub, tiny_artifacts)
    cards: dict = {}
    app, _ = master_store_app(tmp_path, cards, [])
    progress = [p async for p in await ollama_sdk(app).pull(f"hf.co/{LIBRARY_REPO}:Q8_0", stream=True)]
    assert progress[-1].status == "success"
    assert cards[LIBRARY_REPO].gguf_file == "Llama-3.2-1B-Instruct-Q8_0.gguf"


async def test_pull_of_an_unknown_name_is_an_ollama_404_saying_what_is_known(tmp_path, mock_hub):
    app, commands = master_store_app(tmp_path, {}, [])
    async with asgi_http(app) as http:
        reply = await http.post("/ollama/api/pull", json={"model": "llama3.2:70b"})
    assert reply.status_code == 404 and "llama3.2:1b, llama3.2:3b" in reply.json()["error"]
    assert not commands


async def test_an_ollama_name_chats_with_the_placed_repo_it_maps_to():
    """`ollama run llama3.2:1b` after a pull: the name reaches the placed repo's instance, and
    the reply names the model as the client typed it."""
    from tests.api.test_openai_routes import INSTANCE, STATE

    state = STATE.model_copy(update={"instances": {"i1": INSTANCE.model_copy(update={"model_id": LIBRARY_REPO})}})
    app, cluster = scripted_app(["Hi"], state=state)
    reply = await ollama_sdk(app).chat(model="llama3.2:1b", messages=[{"role": "user", "content": "hi"}])
    assert reply.message.content == "Hi" and reply.model == "llama3.2:1b"
    assert cluster.params().model_id == LIBRARY_REPO
    shown = await ollama_sdk(app).show("llama3.2:1b")
    assert shown.modelinfo is not None
    with pytest.raises(ollama.ResponseError) as missing:
        await ollama_sdk(app).chat(model="llama3.2:3b", messages=[{"role": "user", "content": "hi"}])
    assert missing.value.status_code == 404 and "llama3.2:3b" in str(missing.value)


async def test_every_api_maps_an_ollama_name_to_the_placed_repo_and_echoes_the_name():
    from tests.api.test_openai_routes import INSTANCE, STATE
    from tests.api.test_tools_sdk import anthropic_sdk, openai_sdk

    state = STATE.model_copy(update={"instances": {"i1": INSTANCE.model_copy(update={"model_id": LIBRARY_REPO})}})
    app, cluster = scripted_app(["Hi"], state=state)
    chat = await openai_sdk(app).chat.completions.create(model="llama3.2:1b",
                                                         messages=[{"role": "user", "content": "hi"}])
    response = await openai_sdk(app).responses.create(model="llama3.2:1b", input="hi")
    message = await anthropic_sdk(app).messages.create(model="llama3.2:1b", max_tokens=8,
                                                       messages=[{"role": "user", "content": "hi"}])
    assert (chat.model, response.model, message.model) == ("llama3.2:1b",) * 3
    assert (chat.choices[0].message.content, response.output_text, message.content[0].text) == ("Hi",) * 3
    assert [p.model_id for p in cluster.all_params()] == [LIBRARY_REPO] * 3
    with pytest.raises(openai.NotFoundError):
        await openai_sdk(app).chat.completions.create(model="llama3.2:3b", messages=[{"role": "user", "content": "hi"}])


async def test_min_p_is_honoured_on_both_ollama_and_openai_and_bounded():
    app, cluster = scripted_app(["Hi"])
    async with asgi_http(app) as http:
        ok = await http.post("/ollama/api/chat", json={**CHAT, "options": {"min_p": 0.1}})
        openai = await http.post("/v1/chat/completions", json={**CHAT, "min_p": 0.2})
        bad = await http.post("/ollama/api/chat", json={**CHAT, "options": {"min_p": 1.5}})
        bad_openai = await http.post("/v1/chat/completions", json={**CHAT, "min_p": -0.1})
    assert ok.status_code == 200 and openai.status_code == 200, (ok.text, openai.text)
    assert [p.min_p for p in cluster.all_params()] == [0.1, 0.2]
    assert bad.status_code == 400 and "options.min_p" in bad.json()["error"]
    assert bad_openai.status_code == 400 and bad_openai.json()["error"]["param"] == "min_p"


async def test_ollamas_openai_compatible_paths_answer_as_openai():
    """A client pointed at Ollama's base URL + /v1 (the OpenAI SDK with base_url .../ollama/v1)."""
    import openai

    app, _ = scripted_app(["Hi"])
    sdk = openai.AsyncOpenAI(base_url="http://skulk/ollama/v1", api_key="unused",
                             http_client=httpx.AsyncClient(transport=httpx.ASGITransport(app=app)))
    reply = await sdk.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])
    assert reply.choices[0].message.content == "Hi"
    assert [m.id async for m in sdk.models.list()] == [MODEL]
    async with asgi_http(app) as http:
        missing = await http.post("/ollama/v1/chat/completions", json={**CHAT, "model": "nobody/here"})
    assert missing.status_code == 404 and missing.json()["error"]["code"]  # OpenAI's shape, not Ollama's


def test_show_offers_completion_only_for_a_model_that_generates_text():
    from skulk.api.adapters.ollama import show
    from skulk.models.cards import builtin_cards_dir, card_file_name, load_card
    from tests.speech_kit import tiny_whisper_card

    text = load_card(builtin_cards_dir() / card_file_name("local/tiny-llama-gguf"))
    assert show(text.model_id, text, 2048, "now")["capabilities"] == ["completion"]
    speech = tiny_whisper_card()
    assert show(speech.model_id, speech, 448, "now")["capabilities"] == []
