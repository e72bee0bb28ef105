import json
import stat
from pathlib import Path

import pytest

from skulk.provision.bundled_report import backend_of_devices, backend_of_report, version_report
from skulk.provision.llama_binary import ManagedInstall, choose_install, installed_engines, probe_version
from skulk.provision.node_engine import (
    BundledServer,
    ResolvedServer,
    choose_server,
    export_managed_llama_server,
    find_bundled_server,
    resolve_llama_server,
)


def install(version, backend):
    return ManagedInstall(Path(f"/e/llama.cpp-{version}-{backend}"), version, backend)


@pytest.mark.parametrize(
    ("installs", "version", "chosen"),
    [
        ([], "0.3.36", None),
        ([install("0.3.36", "cpu")], "0.3.36", install("0.3.36", "cpu")),
        ([install("0.3.35", "cpu")], "0.3.36", None),
        ([install("0.3.36", "cpu"), install("0.3.36", "cuda")], "0.3.36", install("0.3.36", "cuda")),
        ([install("0.3.36", "vulkan"), install("0.3.36", "cuda")], "0.3.36", install("0.3.36", "cuda")),
        ([install("0.3.35", "cuda"), install("0.3.36", "cpu")], "0.3.36", install("0.3.36", "cpu")),
    ],
)
def test_choose_install(installs, version, chosen):
    assert choose_install(installs, version) == chosen


def _fake_install(engines, version, backend, script="#!/bin/sh\necho 'version: 1 (test)'\n"):
    directory = engines / f"llama.cpp-{version}-{backend}"
    (directory / "bin").mkdir(parents=True)
    server = directory / "bin" / "llama-server"
    server.write_text(script)
    server.chmod(stat.S_IRWXU)
    (directory / "skulk-engine.json").write_text(json.dumps({"version": version, "backend": backend}))
    return server


def test_installed_engines_skips_incomplete_installs(tmp_path):
    _fake_install(tmp_path, "0.3.36", "cpu")
    (tmp_path / "llama.cpp-0.3.36-cuda.partial" / "bin").mkdir(parents=True)
    assert [(i.version, i.backend) for i in installed_engines(tmp_path)] == [("0.3.36", "cpu")]
    assert installed_engines(tmp_path / "absent") == []


def test_an_override_wins_and_is_never_replaced(tmp_path):
    from importlib.metadata import version

    _fake_install(tmp_path, version("llama-cpp-python"), "cpu")
    env = {"SKULK_LLAMA_SERVER_BIN": "/opt/invalid"}
    assert export_managed_llama_server(env, [tmp_path]) is None
    assert env == {"SKULK_LLAMA_SERVER_BIN": "/opt/invalid"}
    assert resolve_llama_server(env, [tmp_path]).source == "override"


def test_the_managed_build_is_exported_for_the_node(tmp_path):
    from importlib.metadata import version

    server = _fake_install(tmp_path, version("llama-cpp-python"), "cpu")
    env: dict[str, str] = {}
    resolved = export_managed_llama_server(env, [tmp_path])
    assert resolved is not None and resolved.source == "managed"
    assert env == {"SKULK_LLAMA_SERVER_BIN": str(server), "SKULK_LLAMA_SERVER_MANAGED_BACKEND": "cpu",
                   "SKULK_LLAMA_SERVER_SOURCE": "managed"}


@pytest.mark.parametrize(
    ("script", "answer"),
    [
        ("#!/bin/sh\necho 'ggml: cpu'\necho 'version: 7 (abc)'\n", "version: 7 (abc)"),
        ("#!/bin/sh\necho 'llama-server 7' >&2\n", "llama-server 7"),
        ("#!/bin/sh\nexit 1\n", None),
        ("not a program", None),
    ],
)
def test_probe_version(tmp_path, script, answer):
    binary = tmp_path / "llama-server"
    binary.write_text(script)
    binary.chmod(stat.S_IRWXU)
    assert probe_version(binary) == answer


BUNDLED = BundledServer(Path("/venv/bin/skulk-llama-server"), "cpu")
MANAGED = install("0.3.36", "cuda")


@pytest.mark.parametrize(
    ("env", "managed", "bundled", "chosen"),
    [
        ({}, None, None, None),
        # Nothing built: the bundled server, so a fresh node serves many requests at once.
        ({}, None, BUNDLED, ResolvedServer(BUNDLED.path, "bundled", "cpu")),
        # A native build is faster (compiled for this machine): it wins over the bundled one.
        ({}, MANAGED, BUNDLED, ResolvedServer(MANAGED.server, "managed", "cuda")),
        # The operator's override beats both.
        ({"SKULK_LLAMA_SERVER_BIN": "/opt/ls"}, MANAGED, BUNDLED, ResolvedServer(Path("/opt/ls"), "override", None)),
        # The bundled server can be turned off.
        ({"SKULK_BUNDLED_LLAMA_SERVER": "0"}, None, BUNDLED, None),
        ({"SKULK_BUNDLED_LLAMA_SERVER": "off"}, MANAGED, BUNDLED, ResolvedServer(MANAGED.server, "managed", "cuda")),
    ],
)
def test_choose_server(env, managed, bundled, chosen):
    assert choose_server(env, managed, bundled) == chosen


@pytest.mark.parametrize(
    ("devices", "backend"),
    [
        ([], "cpu"),
        ([{"name": "CPU", "type": "GGML_BACKEND_DEVICE_TYPE_CPU"}], "cpu"),
        ([{"name": "CPU", "type": "CPU"}, {"name": "CUDA0", "type": "GGML_BACKEND_DEVICE_TYPE_GPU"}], "cuda"),
        ([{"name": "Vulkan0", "type": "GGML_BACKEND_DEVICE_TYPE_GPU"}], "vulkan"),
        ([{"name": "ROCm0", "type": "GGML_BACKEND_DEVICE_TYPE_GPU"}], "rocm"),
        ([{"name": "MTL0", "type": "GGML_BACKEND_DEVICE_TYPE_GPU"}], "metal"),
        # An integrated GPU ggml names otherwise is not a compute we know: cpu.
        ([{"name": "BLAS", "type": "GGML_BACKEND_DEVICE_TYPE_ACCEL"}], "cpu"),
    ],
)
def test_the_bundled_wheels_compute_is_its_first_gpu_device(devices, backend):
    assert backend_of_devices(devices) == backend


@pytest.mark.parametrize(
    ("report", "backend"),
    [
        (version_report("2026.10.1", "cpu"), "cpu"),
        (version_report("2026.10.1", "cuda"), "cuda"),
        ("version: 7 (abc)", None),
        (None, None),
    ],
)
def test_backend_of_report(report, backend):
    assert backend_of_report(report) == backend


def test_the_bundled_server_is_found_beside_this_interpreter_and_names_its_compute():
    bundled = find_bundled_server()
    if bundled is None:
        pytest.skip("xllamacpp is not installed on this platform")
    assert bundled.path.name == "skulk-llama-server" and bundled.backend == "cpu"
    resolved = resolve_llama_server({}, [])
    assert resolved == ResolvedServer(bundled.path, "bundled", "cpu")
