"""Many requests at once through a real node: the tiny GGUF placed on the llama_server
engine (the managed CPU llama-server) with the node's slot setting stamped on the placement
and the server launched with it, eight OpenAI SDK streams decoding together, and a node
killed with SIGKILL leaving no llama-server behind."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import psutil
import pytest

from skulk.provision.llama_build import build_cache_root
from tests.cluster.harness import start_linked, wait_agreed
from tests.e2e.test_openai_serving import MODEL, client, place, wait_instance_ready
from tests.llama_server_kit import (
    HOW_TO_GET_ONE,
    find_native_llama_server,
    llama_servers_under,
    require_bundled_server,
    require_llama_server,
)
from tests.nodeproc import wait_for

pytestmark = pytest.mark.timeout(300)

STREAMS = 8
TOKENS = 400
"""Each stream's length. The requests are held at the frozen server until all eight are in
the runner, so no stream can finish before the last request is in, however fast the machine."""


def llama_servers_of(node) -> list[psutil.Process]:
    return llama_servers_under(node.proc.pid)


def assert_streams_progress_together(node, server: psutil.Process, runner_id: str, streams: int) -> None:
    """`streams` OpenAI SDK streams at once: every one gets its first token before any ends.
    The server is frozen until every request has reached the runner, so a fast machine
    cannot finish one stream while the last request is still on its way through the node,
    and a server that served them one at a time still fails the order check."""
    events: list[tuple[str, int]] = []
    lock = threading.Lock()
    failures: list[BaseException] = []

    clients = [client(node) for _ in range(streams)]  # built up front: building one is slow
    go = threading.Barrier(streams, timeout=60)

    def in_runner() -> int:
        return node.get("/v1/diagnostics/node").json()["worker"]["runners"][runner_id]["inFlight"]

    def stream(index: int) -> None:
        try:
            go.wait()
            chunks = clients[index].chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": f"Story {index}"}], max_tokens=TOKENS,
                temperature=0, stream=True)
            first = True
            for chunk in chunks:
                if chunk.choices and chunk.choices[0].delta.content and first:
                    with lock:
                        events.append(("first", index))
                    first = False
                if chunk.choices and chunk.choices[0].finish_reason:
                    with lock:
                        events.append(("finish", index))
                    assert chunk.choices[0].finish_reason == "length"
        except BaseException as exc:  # reported below, with the node's log
            failures.append(exc)

    server.suspend()
    threads = [threading.Thread(target=stream, args=(i,)) for i in range(streams)]
    try:
        for thread in threads:
            thread.start()
        wait_for(lambda: in_runner() == streams and not failures, timeout_s=50,
                 what=f"all {streams} requests in the runner")
    finally:
        server.resume()
    for thread in threads:
        thread.join(240)
    assert not failures, f"{failures}\n{node.log()[-3000:]}"
    first_finish = next(i for i, (kind, _) in enumerate(events) if kind == "finish")
    assert {i for kind, i in events[:first_finish] if kind == "first"} == set(range(streams)), events
    assert sum(1 for kind, _ in events if kind == "finish") == streams


def test_eight_sdk_streams_progress_together_on_one_instance(spawn_node):
    binary = require_llama_server()
    env = {"SKULK_LLAMA_SERVER_BIN": str(binary), "SKULK_LLAMA_SERVER_PARALLEL": str(STREAMS)}
    (node,) = start_linked(lambda name, extra_args: spawn_node(name, env=env, extra_args=extra_args), ["served"])
    wait_agreed([node], members=1)
    instance = place(node)
    assert [(s["backend"], s["slots"]) for s in instance["preview"]["shards"]] == [("llama_server-cpu", STREAMS)]
    body = wait_instance_ready(node, instance["instanceId"])
    assert [s["backend"] for s in body["shards"]] == ["llama_server-cpu"]
    # The slot count is a placement fact: advertised by the node, stamped in State, obeyed
    # by the runner's server.
    state = node.get("/state").json()
    (resources,) = state["nodeResources"].values()
    assert resources["engineSlots"]["llama_server"] == STREAMS
    (shard,) = state["instances"][instance["instanceId"]]["shards"]
    assert (shard["slots"], shard["slotsWanted"]) == (STREAMS, None)
    (server,) = llama_servers_of(node)
    argv = server.cmdline()
    assert argv[argv.index("--parallel") + 1] == str(STREAMS)

    assert_streams_progress_together(node, server, shard["runnerId"], STREAMS)

    # kill -9 of the node: its runner follows within a second, and the runner's server with it.
    ours = llama_servers_of(node)  # not other tests' servers: the box is shared
    assert ours
    node.signal(signal.SIGKILL)
    wait_for(lambda: not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in ours),
             timeout_s=20, what="llama-server gone after the node was killed")


def test_an_invalid_slot_setting_withdraws_llama_server_with_the_reason(spawn_node):
    env = {"SKULK_LLAMA_SERVER_BIN": str(require_llama_server()), "SKULK_LLAMA_SERVER_PARALLEL": "0"}
    (node,) = start_linked(lambda name, extra_args: spawn_node(name, env=env, extra_args=extra_args), ["badslots"])
    wait_agreed([node], members=1)
    node_id = node.get("/node_id").json()["nodeId"]
    resources = wait_for(lambda: node.get("/state").json()["nodeResources"].get(node_id), timeout_s=30,
                         what="the node's resources")
    assert not any(tag.startswith("llama_server") for tag in resources["backends"]), resources["backends"]
    (conflict,) = [c for c in resources["capabilityConflicts"] if c["code"] == "invalid_slot_setting"]
    assert conflict["level"] == "error" and "SKULK_LLAMA_SERVER_PARALLEL='0'" in conflict["message"]
    # The model is still served, by the engine the node can run, which says one slot.
    instance = place(node)
    assert [(s["backend"], s["slots"]) for s in instance["preview"]["shards"]] == [("llama_cpp-cpu", 1)]
    assert not llama_servers_of(node)


def test_an_operator_chooses_one_placements_slots(spawn_node):
    """`slots` on /place_instance: bad counts are typed 400s that place nothing; a good one
    is previewed, stamped in State, and the runner's server is launched with it."""
    env = {"SKULK_LLAMA_SERVER_BIN": str(require_llama_server()), "SKULK_LLAMA_SERVER_PARALLEL": "2"}
    (node,) = start_linked(lambda name, extra_args: spawn_node(name, env=env, extra_args=extra_args), ["slots"])
    wait_agreed([node], members=1)
    node_id = node.get("/node_id").json()["nodeId"]
    wait_for(lambda: node.get("/state").json()["nodeResources"].get(node_id), timeout_s=30, what="resources")
    for slots, says in ((0, "llama_server takes 1..64"), (65, "llama_server takes 1..64"),
                        (10**9, "llama_server takes 1..64")):
        refused = httpx.post(node.url + "/place_instance", json={"modelId": MODEL, "slots": slots}, timeout=10)
        assert refused.status_code == 400, refused.text
        error = refused.json()["error"]
        assert error["code"] == "invalid_slot_setting" and says in error["message"], error
    previews = node.get("/instance/previews", params={"modelId": MODEL, "slots": 99})
    assert previews.status_code == 400 and previews.json()["error"]["code"] == "invalid_slot_setting"
    assert node.get("/state").json()["instances"] == {}

    (option, *_) = node.get("/instance/previews", params={"modelId": MODEL, "slots": 3}).json()["previews"]
    assert [(s["backend"], s["slots"]) for s in option["shards"]] == [("llama_server-cpu", 3)]
    dry = place(node, slots=3, dryRun=True)
    assert [(s["backend"], s["slots"]) for s in dry["preview"]["shards"]] == [("llama_server-cpu", 3)]
    instance = place(node, slots=3)
    body = wait_instance_ready(node, instance["instanceId"])
    assert body["requestedSlots"] == 3 and [s["slots"] for s in body["shards"]] == [3]
    (server,) = llama_servers_of(node)
    argv = server.cmdline()
    assert argv[argv.index("--parallel") + 1] == "3"  # the placement's count, not the node's 2
    reply = client(node).chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}],
                                                 max_tokens=4, temperature=0)
    assert reply.usage.completion_tokens >= 1


def _fresh_env(tmp_path) -> dict[str, str]:
    """A node on a machine where nothing was built: no override, an empty engines dir (on a
    GPU machine, bench/gpu/check.sh names the dir holding only the GPU wheel it installed)."""
    engines = os.environ.get("SKULK_GPU_CHECK_ENGINES_DIR") or str(tmp_path / "no-engines-built")
    return {"SKULK_LLAMA_SERVER_BIN": "", "SKULK_ENGINES_DIR": engines,
            "SKULK_BUNDLED_LLAMA_SERVER": "1"}


def test_a_fresh_node_serves_four_streams_at_once_with_nothing_built(spawn_node, tmp_path):
    """Out of the box: no `skulk engines install`, nothing prebuilt by the test. The node
    serves the GGUF with the bundled llama-server (xllamacpp's wheel) at its default slots."""
    require_bundled_server()
    (node,) = start_linked(lambda name, extra_args: spawn_node(name, env=_fresh_env(tmp_path), extra_args=extra_args),
                           ["fresh"])
    wait_agreed([node], members=1)
    instance = place(node)
    # llama_server on the node's compute: cpu here, cuda where a GPU wheel is installed (bench/gpu/check.sh).
    ((backend, slots),) = [(s["backend"], s["slots"]) for s in instance["preview"]["shards"]]
    assert backend.startswith("llama_server-") and slots == 4, instance["preview"]
    body = wait_instance_ready(node, instance["instanceId"])
    (shard,) = node.get("/state").json()["instances"][instance["instanceId"]]["shards"]
    (server,) = llama_servers_of(node)
    assert Path(server.cmdline()[1]).name == "skulk-llama-server", server.cmdline()
    assert [s["backend"] for s in body["shards"]] == [backend]
    assert_streams_progress_together(node, server, shard["runnerId"], 4)


def assert_placed_on(node, installed: Path) -> None:
    """A placement on `node` starts the llama-server at `installed`, and it answers."""
    instance = place(node)
    wait_instance_ready(node, instance["instanceId"])
    (server,) = llama_servers_of(node)
    assert Path(server.cmdline()[0]) == installed, server.cmdline()
    reply = client(node).chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}],
                                                 max_tokens=4, temperature=0)
    assert reply.usage.completion_tokens >= 1


def test_a_managed_build_serves_a_node_whatever_its_data_dir(spawn_node, tmp_path):
    """`skulk engines install` (here a copy out of the machine's build cache, as any second
    install is), then a node on another data dir: it advertises and serves with that build."""
    native = find_native_llama_server()
    if native is None:
        pytest.skip(HOW_TO_GET_ONE)
    cache_home = tmp_path / "xdg-cache"
    install_env = {**os.environ, "XDG_CACHE_HOME": str(cache_home), "SKULK_LLAMA_SERVER_BIN": ""}
    install_env.pop("SKULK_ENGINES_DIR", None)
    install_env["SKULK_ENGINE_BUILD_CACHE"] = str(build_cache_root(os.environ, Path.home()))
    done = subprocess.run([sys.executable, "-m", "skulk", "engines", "install", "--backend", "cpu"],
                          env=install_env, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stderr[-3000:]
    (installed,) = (cache_home / "skulk" / "engines").glob("llama.cpp-*-cpu/bin/llama-server")

    env = {"XDG_CACHE_HOME": str(cache_home), "SKULK_LLAMA_SERVER_BIN": "", "SKULK_ENGINES_DIR": ""}
    (node,) = start_linked(lambda name, extra_args: spawn_node(name, data_dir=tmp_path / "srv" / "other", env=env,
                                                               extra_args=extra_args), ["other"])
    wait_agreed([node], members=1)
    node_id = node.get("/node_id").json()["nodeId"]
    resources = wait_for(lambda: node.get("/state").json()["nodeResources"].get(node_id), timeout_s=30,
                         what="the node's resources")
    assert "llama_server-cpu" in resources["backends"], resources["backends"]
    assert_placed_on(node, installed)


def test_a_fresh_node_builds_a_native_server_in_the_background_and_switches_to_it(spawn_node, tmp_path):
    """First start with autoprovision on: the node builds the native server in the background
    (here out of the machine's warm build cache, as a second node's build is), reports it in
    /v1/cluster, and places new instances on it."""
    require_bundled_server()
    if find_native_llama_server() is None or shutil.which("cmake") is None:
        pytest.skip(HOW_TO_GET_ONE)
    engines = tmp_path / "machine-engines"
    env = {**_fresh_env(tmp_path), "SKULK_ENGINES_DIR": str(engines), "SKULK_NO_ENGINE_AUTOPROVISION": "0",
           "SKULK_ENGINE_BUILD_CACHE": str(build_cache_root(os.environ, Path.home()))}
    (node,) = start_linked(lambda name, extra_args: spawn_node(name, env=env, extra_args=extra_args), ["building"])
    wait_agreed([node], members=1)
    node_id = node.get("/node_id").json()["nodeId"]

    def provision():
        (me,) = [n for n in node.get("/v1/cluster").json()["nodes"] if n["nodeId"] == node_id]
        build = me.get("engineProvision")
        assert build is None or build["state"] in ("building", "ready"), f"{build}\n{node.log()[-3000:]}"
        return build if build and build["state"] == "ready" else None

    build = wait_for(provision, timeout_s=240, what="the background build ready")
    assert build["backend"] == "cpu" and str(engines) in build["message"]
    (installed,) = engines.glob("llama.cpp-*-cpu/bin/llama-server")
    assert_placed_on(node, installed)
