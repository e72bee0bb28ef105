"""A workload added as a row: the `echo` workload is served end to end by a real node and
its real llama.cpp runner, and adding it took the files listed below and nothing else.

`ECHO_FILES` is the footprint of a new one-result workload (issue 28): its params and
result (`workload_io.py`), its row (`workloads.py`), the engines that serve it (the traits
table) and the engine method, plus this test. The worker, runner, master and API carry it
through the row; `test_echo_lives_only_in_its_files` holds that true."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest

from tests.tiny_archs import write_tiny_arch_gguf

pytestmark = pytest.mark.timeout(600)

ROOT = Path(__file__).resolve().parents[2]
ECHO_FILES = (
    "src/skulk/shared/types/workload_io.py",
    "src/skulk/shared/types/workloads.py",
    "src/skulk/shared/types/engines.py",
    "src/skulk/worker/engines/llama_cpp/engine.py",
    "tests/cluster/test_echo_workload.py",
)
ECHO_MARKS = re.compile(r"\bEcho(Params|Result)\b|\"echo\"|def echo\(")
"""What only the echo workload's own files in src/ name: its types, its kind, its engine
method (legacy completions' `echo` parameter is another thing, spelled `prompt_logprobs`)."""

# A node with no llama-server serves GGUF on the in-process engine, the one that echoes.
ENV = {"SKULK_NO_ENGINE_AUTOPROVISION": "1", "SKULK_BUNDLED_LLAMA_SERVER": "0", "SKULK_LLAMA_SERVER_BIN": ""}


def test_echo_lives_only_in_its_files():
    assert len(ECHO_FILES) <= 5
    naming = sorted(str(path.relative_to(ROOT)) for path in (ROOT / "src").rglob("*.py")
                    if ECHO_MARKS.search(path.read_text()))
    # Tests may name it anywhere (the table's own tests walk every row, echo among them).
    assert naming == sorted(f for f in ECHO_FILES if f.startswith("src/")), naming


def test_echo_is_served_by_a_real_runner(spawn_node, tmp_path):
    from tests.cluster.test_any_architecture import add_local, place, remove

    root = tmp_path / "models"
    root.mkdir()
    path = write_tiny_arch_gguf(root / "tiny-granite.gguf", "granite")
    node = spawn_node("echo", env={**ENV, "SKULK_MODELS_LOCAL_DIRS": str(root)}).wait_ready()
    listed = {row["kind"]: row for row in node.get("/v1/workloads").json()["workloads"]}
    assert listed["echo"]["engines"] == ["llama_cpp"] and listed["echo"]["oneResult"]
    assert not listed["text"]["oneResult"]

    card = add_local(node, path)
    instance_id = place(node, card["modelId"])
    backend = node.get("/state").json()["instances"][instance_id]["shards"][0]["backend"]
    assert backend.startswith("llama_cpp"), backend

    text = "the quick brown fox, once more"
    reply = httpx.post(node.url + "/v1/workloads/echo", json={"model": card["modelId"], "text": text},
                       headers=node.auth, timeout=120)
    assert reply.status_code == 200, reply.text
    body = reply.json()
    result = body["result"]
    assert body["workload"] == "echo" and result["workload"] == "echo"
    assert result["tokens"] and all(isinstance(token, int) for token in result["tokens"])
    assert result["text"] == text  # the model's own tokenizer round-trips it
    assert body["usage"]["promptTokens"] == len(result["tokens"])
    # The master saw the request redacted: the text never reaches State.
    assert text not in node.get("/state").text

    # Bad input is the caller's typed 400 in OpenAI's shape, and changes nothing.
    for bad, param in (({"model": card["modelId"], "text": 3}, "text"),
                       ({"model": card["modelId"], "text": "x", "extra": 1}, "extra"),
                       ({"text": "x"}, "model")):
        refused = httpx.post(node.url + "/v1/workloads/echo", json=bad, headers=node.auth, timeout=30)
        assert refused.status_code == 400 and refused.json()["error"]["param"] == param, refused.text
    unknown = httpx.post(node.url + "/v1/workloads/nope", json={"model": card["modelId"]}, headers=node.auth,
                         timeout=30)
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "unknown_workload"
    streamed = httpx.post(node.url + "/v1/workloads/text", json={"model": card["modelId"]}, headers=node.auth,
                          timeout=30)
    assert streamed.status_code == 400 and "/v1/chat/completions" in streamed.text
    remove(node, instance_id)
