"""The cluster client commands against a live node (a real `skulk` process, the real
llama.cpp runner on the tiny GGUF model, the mock hub for search and add): every command,
its output, and its exit code, including a bad model name and an impossible placement."""

from __future__ import annotations

import builtins
import os
import subprocess
import sys

import httpx
import pytest

from skulk.client.commands import _repl
from skulk.client.http import NodeClient
from tests.cluster.harness import start_linked, wait_agreed
from tests.mockhub import TINY_GGUF_REPO, mock_hub, tiny_artifacts  # noqa: F401 - fixtures
from tests.nodeproc import NodeProcess, wait_for

MODEL = "local/tiny-llama-gguf"
CLI_TIMEOUT_S = 120
"""A hang guard for one CLI run (placement and a cold chat included)."""


def skulk(node: NodeProcess, *args: str, stdin: str = "") -> subprocess.CompletedProcess:
    env = {**os.environ, "SKULK_URL": node.url, "COLUMNS": "200"}
    env.pop("SKULK_API_KEY", None)
    return subprocess.run([sys.executable, "-m", "skulk", *args], input=stdin, capture_output=True, text=True,
                          env=env, timeout=CLI_TIMEOUT_S)


def instances(node: NodeProcess) -> dict:
    return node.get("/state").json()["instances"]


def wait_serving(node: NodeProcess) -> None:
    def serving():
        state = node.get("/state").json()
        runners = [state["runners"].get(s["runnerId"], {}).get("state")
                   for i in state["instances"].values() for s in i["shards"]]
        return runners and all(r in ("Ready", "Running") for r in runners)

    wait_for(serving, timeout_s=120, what="instance serving")


@pytest.fixture
def node(spawn_node, mock_hub):
    (solo,) = start_linked(spawn_node, ["solo"])
    wait_agreed([solo], members=1)
    wait_for(lambda: solo.get("/state").json()["nodeResources"], timeout_s=30, what="resources")
    return solo


def test_status_place_ps_chat_unplace(node):
    status = skulk(node, "status")
    assert status.returncode == 0, status.stderr
    assert "solo" in status.stdout and "master" in status.stdout and "no instances placed" in status.stdout

    dry = skulk(node, "place", MODEL, "--dry-run", "--exclude", "nobody-at-all")
    assert dry.returncode == 1 and "unknown_node" in dry.stderr and "solo" in dry.stderr
    dry = skulk(node, "place", MODEL, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "would place" in dry.stdout and "solo" in dry.stdout and instances(node) == {}

    placed = skulk(node, "place", MODEL)
    assert placed.returncode == 0, placed.stderr
    (instance_id,) = wait_for(lambda: list(instances(node)), timeout_s=30, what="instance")
    assert f"placed {instance_id}" in placed.stdout
    wait_serving(node)

    ps = skulk(node, "ps")
    assert ps.returncode == 0 and instance_id in ps.stdout and MODEL in ps.stdout and "Ready" in ps.stdout
    status = skulk(node, "status")
    assert instance_id in status.stdout and "Ready" in status.stdout

    one_shot = skulk(node, "chat", MODEL, "-p", "Tell me about the weather.", "--max-tokens", "8", "--temperature", "0")
    assert one_shot.returncode == 0, one_shot.stderr
    reference = httpx.post(node.url + "/v1/chat/completions", timeout=60, json={
        "model": MODEL, "messages": [{"role": "user", "content": "Tell me about the weather."}],
        "max_tokens": 8, "temperature": 0}).json()["choices"][0]["message"]["content"]
    assert one_shot.stdout.strip() == reference.strip()  # the streamed text is the whole answer
    piped = skulk(node, "chat", MODEL, "--max-tokens", "8", "--temperature", "0", stdin="Tell me about the weather.\n")
    assert piped.returncode == 0 and piped.stdout.strip() == reference.strip()

    gone = skulk(node, "unplace", MODEL)
    assert gone.returncode == 0 and f"deleting {instance_id}" in gone.stdout
    wait_for(lambda: instances(node) == {}, timeout_s=30, what="instance deleted")
    assert "no instances placed" in skulk(node, "ps").stdout


def test_the_repl_keeps_the_conversation_and_leaves_on_exit(node, monkeypatch, capsys):
    assert skulk(node, "place", MODEL).returncode == 0
    wait_serving(node)
    lines = iter(["hello", "", "and again", "/exit"])
    monkeypatch.setattr(builtins, "input", lambda _prompt="": next(lines))
    seen = []
    original = NodeClient.stream_chat

    def recording(self, body):
        seen.append([m["role"] for m in body["messages"]])
        return original(self, body)

    monkeypatch.setattr(NodeClient, "stream_chat", recording)
    with NodeClient(node.url, None) as client:
        _repl(client, MODEL, 6, 0.0)
    assert seen == [["user"], ["user", "assistant", "user"]]
    out = capsys.readouterr().out
    assert out.count("\n") >= 3 and "chatting with" in out


REFUSALS = [
    (("place", "no/such-model"), "unknown_model", ("404", "no/such-model")),
    (("place", MODEL, "--nodes", "3"), "topology_gap", ("400", "needs 3 compatible node(s)")),
    (("place", MODEL, "--exclude", "solo"), "exclusions_removed_all", ("400", "exclude fewer")),
    (("place", MODEL, "--sharding", "Diagonal"), "invalid_request", ("Pipeline or Tensor",)),
    (("place", MODEL, "--slots", "0"), "invalid_slot_setting", ("400", "llama_server takes 1..64")),
    # chat places what is not placed: a repo the hub does not have fails at adding its card
    (("chat", "no/such-model", "-p", "hi"), "", ("404", "no/such-model", "does not exist on the hub")),
    (("chat", "llama3.2:70b", "-p", "hi"), "", ("404", "llama3.2:1b, llama3.2:3b")),
    (("unplace", "no/such-model"), "not_found", ("no/such-model",)),
    (("models", "add", "owner/missing-repo"), "", ("404",)),
]
"""(arguments, error code, words of the message): one live node answers the whole table."""


def test_errors_are_the_apis_typed_errors_with_a_failing_exit(node):
    for args, code, words in REFUSALS:
        result = skulk(node, *args)
        assert result.returncode == 1, (args, result.stdout)
        assert result.stderr.startswith("skulk: ") and code in result.stderr, (args, result.stderr)
        for word in words:
            assert word in result.stderr, (args, result.stderr)
    assert instances(node) == {}  # nothing was placed by any refusal


def test_models_search_and_add_through_the_node(node):
    found = skulk(node, "models", "search", "tiny-llama")
    assert found.returncode == 0, found.stderr
    assert TINY_GGUF_REPO in found.stdout and "gguf" in found.stdout
    added = skulk(node, "models", "add", TINY_GGUF_REPO)
    assert added.returncode == 0, added.stderr
    assert f"added {TINY_GGUF_REPO}" in added.stdout
    models = {m["modelId"] for m in node.get("/models").json()["models"]}
    assert TINY_GGUF_REPO in models


def test_an_unreachable_node_is_a_plain_error(tmp_path):
    closed = NodeProcess(data_dir=tmp_path / "none", api_port=9)  # discard port: nothing listens
    result = skulk(closed, "status")
    assert result.returncode == 1 and "cannot reach a Skulk node" in result.stderr


def test_chat_places_an_unplaced_model_named_as_ollama_names_it(node, mock_hub, tiny_artifacts):
    """`skulk chat llama3.2:1b` as `ollama run` does: the library table maps the name to a
    GGUF repo, the node adds its card from the (mock) hub, places it, downloads, answers."""
    gguf = tiny_artifacts.gguf_path.read_bytes()
    mock_hub.add_repo("bartowski/Llama-3.2-1B-Instruct-GGUF", {"Llama-3.2-1B-Instruct-Q4_K_M.gguf": gguf},
                      tags=("gguf", "llama"))
    result = skulk(node, "chat", "llama3.2:1b", "-p", "Tell me about the weather.", "--max-tokens", "8",
                   "--temperature", "0")
    assert result.returncode == 0, result.stderr
    assert "added bartowski/Llama-3.2-1B-Instruct-GGUF (Llama-3.2-1B-Instruct-Q4_K_M.gguf)" in result.stderr
    assert "placed bartowski/Llama-3.2-1B-Instruct-GGUF" in result.stderr and "solo" in result.stderr
    assert result.stdout.strip()
    (instance,) = instances(node).values()
    assert instance["modelId"] == "bartowski/Llama-3.2-1B-Instruct-GGUF"
    again = skulk(node, "chat", "bartowski/Llama-3.2-1B-Instruct-GGUF", "-p", "hi", "--max-tokens", "4")
    assert again.returncode == 0 and "placed" not in again.stderr  # already placed: straight to the answer
