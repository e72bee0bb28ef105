"""The background native build: when a node starts one, how its progress reads, and the
shell that runs it (a real subprocess, stopped with its owner)."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import psutil
import pytest

from skulk.provision.autoprovision import (
    BuildInBackground,
    NoBuild,
    autoprovision_decision,
    missing_tools,
    opted_out,
    progress_line,
    provision_after_line,
    provision_ended,
)
from skulk.provision.background_install import BackgroundInstall
from skulk.provision.llama_binary import ManagedInstall
from skulk.provision.node_engine import adopt_install, export_pool_rpc_server, server_source
from skulk.shared.types.telemetry import EngineProvision

ALL_TOOLS = {"cmake", "g++", "nvcc", "glslc"}


def which_of(present):
    return lambda name: f"/usr/bin/{name}" if name in present else None


@pytest.mark.parametrize(
    ("backend", "present", "missing"),
    [
        ("cpu", ALL_TOOLS, ()),
        ("cpu", {"cmake", "clang++"}, ()),
        ("cpu", {"g++"}, ("cmake",)),
        ("cpu", set(), ("cmake", "c++ or g++ or clang++")),
        ("cuda", {"cmake", "g++"}, ("nvcc",)),
        ("vulkan", {"cmake", "g++"}, ("glslc",)),
        ("metal", {"cmake", "clang++"}, ()),
    ],
)
def test_missing_tools(backend, present, missing):
    assert missing_tools(backend, which_of(present)) == missing


BASE = {"override": False, "worker_enabled": True, "backend": "cpu", "installed_backends": (), "missing": ()}


@pytest.mark.parametrize(
    ("env", "changes", "decision"),
    [
        ({}, {}, BuildInBackground("cpu")),
        ({}, {"backend": "cuda", "installed_backends": ("cpu",)}, BuildInBackground("cuda")),  # a CPU build on a GPU box
        ({}, {"installed_backends": ("cpu",)}, NoBuild("a cpu build is installed")),
        ({}, {"backend": "cuda", "wheel_possible": True, "missing": ("nvcc",)}, BuildInBackground("cuda", wheel=True)),
        ({}, {"backend": "cuda", "wheel_possible": True, "installed_backends": ("cuda",)}, NoBuild("a cuda build is installed")),
        ({}, {"wheel_possible": True}, BuildInBackground("cpu")),  # no CPU wheel beats the bundled one
        ({}, {"override": True}, NoBuild("the operator named a llama-server (SKULK_LLAMA_SERVER_BIN)")),
        ({"SKULK_NO_ENGINE_AUTOPROVISION": "1"}, {}, NoBuild("SKULK_NO_ENGINE_AUTOPROVISION is set")),
        ({"SKULK_NO_ENGINE_AUTOPROVISION": "yes"}, {"missing": ("cmake",)}, NoBuild("SKULK_NO_ENGINE_AUTOPROVISION is set")),
        ({}, {"worker_enabled": False}, NoBuild("this node runs no worker")),
    ],
)
def test_autoprovision_decision(env, changes, decision):
    assert autoprovision_decision(env, **{**BASE, **changes}) == decision


def test_a_build_that_cannot_run_is_reported_with_its_fix():
    decision = autoprovision_decision({}, **{**BASE, "missing": ("cmake",)})
    assert isinstance(decision, NoBuild) and decision.shown is not None
    assert decision.shown.state == "skipped"
    assert "cmake not found" in decision.shown.message and "apt-get install cmake" in decision.shown.message
    assert "SKULK_NO_ENGINE_AUTOPROVISION=1" in decision.shown.message


@pytest.mark.parametrize(("value", "off"), [("", False), ("0", False), ("1", True), ("TRUE", True), ("on", True)])
def test_opted_out(value, off):
    assert opted_out({"SKULK_NO_ENGINE_AUTOPROVISION": value}) is off


START = EngineProvision(state="building", backend="cpu", step="start")


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (progress_line("download", 10, 100), START.model_copy(update={"step": "download", "done": 10, "total": 100})),
        (progress_line("wait", 4, None), START.model_copy(update={"step": "wait", "done": 4})),
        ('{"step": "build", "done": -1, "total": "x"}', START.model_copy(update={"step": "build"})),
        ("-- Configuring done", START),
        ('{"step": 3}', START),
        ('{"half": ', START),
        ("[1, 2]", START),
    ],
)
def test_provision_after_line(line, expected):
    assert provision_after_line(START, line) == expected


def test_provision_ended():
    ready = provision_ended(START, 0, "/e/llama.cpp-1-cpu/bin/llama-server", "")
    assert (ready.state, ready.step) == ("ready", None) and "/e/llama.cpp-1-cpu" in ready.message
    failed = provision_ended(START, 1, None, "cmake build failed")
    assert failed.state == "failed" and "exit 1" in failed.message and "cmake build failed" in failed.message
    assert provision_ended(START, 0, None, "").state == "failed"  # exited 0 yet nothing installed


def test_a_background_build_never_replaces_an_operators_binary():
    install = ManagedInstall(Path("/e/llama.cpp-1-cpu"), "1", "cpu")
    operator = {"SKULK_LLAMA_SERVER_BIN": "/opt/mine"}
    assert not adopt_install(operator, install) and operator == {"SKULK_LLAMA_SERVER_BIN": "/opt/mine"}
    exported = {"SKULK_LLAMA_SERVER_BIN": "/venv/bin/skulk-llama-server", "SKULK_LLAMA_SERVER_SOURCE": "bundled"}
    assert adopt_install(exported, install)
    assert exported["SKULK_LLAMA_SERVER_BIN"] == str(install.server) and server_source(exported) == "managed"
    assert server_source({}) is None and server_source(operator) == "override"


class ScriptedInstall(BackgroundInstall):
    """The real shell around a stand-in for `skulk engines install` (a compile takes minutes)."""

    def __init__(self, script: str, search_dirs) -> None:
        super().__init__(BuildInBackground("cpu"), search_dirs)
        self.script = script

    def command(self) -> list[str]:
        return [sys.executable, "-c", self.script]


def _fake_install(root: Path) -> Path:
    directory = root / "llama.cpp-1-cpu"
    (directory / "bin").mkdir(parents=True)
    (directory / "skulk-engine.json").write_text(json.dumps({"version": "1", "backend": "cpu"}))
    return directory


def test_progress_is_read_and_the_finished_build_adopted(tmp_path, monkeypatch):
    monkeypatch.setattr("skulk.provision.node_engine.llama_cpp_version", lambda: "1")
    script = (f"import sys; print({progress_line('build', 5, 10)!r}, flush=True); "
              "sys.stderr.write('compiling\\n'); "
              f"import pathlib, json; d = pathlib.Path({str(tmp_path)!r}) / 'llama.cpp-1-cpu' / 'bin'; "
              "d.mkdir(parents=True); (d.parent / 'skulk-engine.json').write_text(json.dumps({'version': '1', 'backend': 'cpu'}))")
    build = ScriptedInstall(script, [tmp_path])
    adopted: list[ManagedInstall] = []
    asyncio.run(build.run(adopted.append))
    assert build.status is not None and build.status.state == "ready", build.status
    assert (build.status.done, build.status.total) == (5, 10)
    assert adopted == [ManagedInstall(tmp_path / "llama.cpp-1-cpu", "1", "cpu")]


def test_a_failed_build_says_why_and_adopts_nothing(tmp_path):
    build = ScriptedInstall("import sys; sys.stderr.write('skulk: cmake is not installed\\n'); sys.exit(1)", [tmp_path])
    adopted: list[ManagedInstall] = []
    asyncio.run(build.run(adopted.append))
    assert build.status is not None and build.status.state == "failed"
    assert "cmake is not installed" in build.status.message and adopted == []


def test_the_build_process_does_not_outlive_its_owner(tmp_path):
    marker = tmp_path / "started"
    build = ScriptedInstall(
        f"import os, pathlib, time; pathlib.Path({str(marker)!r}).write_text(str(os.getpid())); time.sleep(600)",
        [tmp_path])

    async def cancel_when_started() -> int:
        task = asyncio.create_task(build.run(lambda install: None))
        async with asyncio.timeout(60):
            while not marker.exists() or not marker.read_text():
                await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return int(marker.read_text())

    pid = asyncio.run(cancel_when_started())
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def _native(root: Path, backend: str, *, rpc: bool = True) -> ManagedInstall:
    directory = root / f"llama.cpp-1-{backend}"
    (directory / "bin").mkdir(parents=True)
    if rpc:
        (directory / "bin" / "ggml-rpc-server").write_text("")
    return ManagedInstall(directory, "1", backend)


@pytest.mark.parametrize(("name", "env", "backend", "rpc", "exported"), [
    ("nothing set: the managed build's server", {}, "cpu", True, "cpu"),
    ("a build without one: nothing", {}, "cpu", False, None),
    ("the operator's server is kept", {"SKULK_POOL_RPC_SERVER_BIN": "/opt/rpc"}, "cuda", True, "/opt/rpc"),
    ("an exported CPU server gives way to a GPU build's",
     {"SKULK_POOL_RPC_SERVER_BIN": "CPU", "SKULK_POOL_RPC_SERVER_SOURCE": "managed"}, "cuda", True, "cuda"),
    ("an exported server never gives way to a CPU build's",
     {"SKULK_POOL_RPC_SERVER_BIN": "GPU", "SKULK_POOL_RPC_SERVER_SOURCE": "managed"}, "cpu", True, "GPU"),
])
def test_a_pool_donor_uses_the_managed_rpc_server(tmp_path, name, env, backend, rpc, exported):
    install = _native(tmp_path, backend, rpc=rpc)
    env = dict(env)
    export_pool_rpc_server(env, install)
    expected = {"cpu": str(install.rpc_server), "cuda": str(install.rpc_server)}.get(exported or "", exported)
    assert env.get("SKULK_POOL_RPC_SERVER_BIN") == expected, name
    # a background build that lands exports it too, even beside an operator's llama-server
    later = {"SKULK_LLAMA_SERVER_BIN": "/opt/mine"}
    assert adopt_install(later, install) is rpc
    assert later.get("SKULK_POOL_RPC_SERVER_BIN") == (str(install.rpc_server) if rpc else None)
