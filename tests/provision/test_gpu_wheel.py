"""A GPU llama-server without a compiler: which xllamacpp GPU wheel fits, where it goes, and
that the bundled server serves from it when installed (a stand-in wheel that reports a CUDA
device: no GPU here)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from skulk.provision.gpu_wheel import (
    WHEEL_INDEX_ROOT,
    WheelInstall,
    choose_wheel,
    cuda_version_of,
    install_command,
    wheel_index,
    wheel_install_dir,
)
from skulk.provision.llama_binary import ManagedInstall, installed_engines, installed_wheels
from skulk.provision.node_engine import (
    SITE_ENV,
    BundledServer,
    ResolvedServer,
    adopt_install,
    choose_server,
    export_managed_llama_server,
    find_bundled_server,
    xllamacpp_version,
)


@pytest.mark.parametrize(
    ("backend", "driver", "index"),
    [
        ("cuda", (13, 2), f"{WHEEL_INDEX_ROOT}/cu132"),
        ("cuda", (13, 0), f"{WHEEL_INDEX_ROOT}/cu128"),  # a 13.0 driver cannot JIT the 13.2 wheel's PTX
        ("cuda", (12, 8), f"{WHEEL_INDEX_ROOT}/cu128"),
        ("cuda", (12, 4), None),
        ("cuda", None, f"{WHEEL_INDEX_ROOT}/cu128"),
        ("vulkan", None, f"{WHEEL_INDEX_ROOT}/vulkan"),
        ("cpu", None, None),
        ("metal", None, None),
    ],
)
def test_wheel_index(backend, driver, index):
    assert wheel_index(backend, driver) == index


@pytest.mark.parametrize(("encoded", "version"), [(12080, (12, 8)), (13020, (13, 2)), (11040, (11, 4))])
def test_cuda_version_of(encoded, version):
    assert cuda_version_of(encoded) == version


def test_install_command_pins_the_version_and_the_index():
    command = install_command(["uv", "pip", "--python", "/venv/bin/python"], Path("/e/x/site"), "https://i/cu128", "1.2")
    assert command == ["uv", "pip", "--python", "/venv/bin/python", "install", "--no-deps", "--target", "/e/x/site",
                       "--index-url", "https://i/cu128", "xllamacpp==1.2"]


def test_choose_wheel():
    cuda, vulkan, old = (WheelInstall(Path(f"/e/{n}"), v, b) for n, v, b in
                         (("a", "2", "cuda"), ("b", "2", "vulkan"), ("c", "1", "cuda")))
    assert choose_wheel([vulkan, cuda, old], "2") == cuda
    assert choose_wheel([old], "2") is None


def _wheel_dir(engines: Path, version: str, backend: str, device: str) -> Path:
    """A stand-in GPU wheel: an `xllamacpp` whose device list names `device`."""
    directory = wheel_install_dir(engines, version, backend)
    package = directory / "site" / "xllamacpp"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(
        f"def get_device_info():\n    return [{{'name': 'CPU', 'type': 'CPU'}}, {{'name': {device!r}, 'type': 'GPU'}}]\n")
    (directory / "skulk-engine.json").write_text(json.dumps({"kind": "wheel", "version": version, "backend": backend}))
    return directory


def test_a_wheel_install_is_not_a_native_build(tmp_path):
    _wheel_dir(tmp_path, "2", "cuda", "CUDA0")
    assert installed_engines(tmp_path) == []
    assert installed_wheels(tmp_path) == [WheelInstall(tmp_path / "xllamacpp-2-cuda", "2", "cuda")]


BUNDLED_CUDA = BundledServer(Path("/venv/bin/skulk-llama-server"), "cuda", Path("/e/xllamacpp-2-cuda/site"))


@pytest.mark.parametrize(
    ("managed", "bundled", "chosen"),
    [
        # A CUDA wheel beats a native CPU build: the GPU first.
        (ManagedInstall(Path("/e/n"), "1", "cpu"), BUNDLED_CUDA,
         ResolvedServer(BUNDLED_CUDA.path, "bundled", "cuda", BUNDLED_CUDA.site)),
        # A native CUDA build beats the wheel: compiled for this very GPU.
        (ManagedInstall(Path("/e/n"), "1", "cuda"), BUNDLED_CUDA,
         ResolvedServer(Path("/e/n/bin/llama-server"), "managed", "cuda")),
    ],
)
def test_the_gpu_comes_first(managed, bundled, chosen):
    assert choose_server({}, managed, bundled) == chosen


def test_the_bundled_server_serves_from_an_installed_gpu_wheel(tmp_path, monkeypatch):
    version = xllamacpp_version()
    if version is None or find_bundled_server() is None:
        pytest.skip("xllamacpp is not installed on this platform")
    directory = _wheel_dir(tmp_path, version, "cuda", "CUDA0")
    found = find_bundled_server([tmp_path])
    assert found == BundledServer(Path(sys.executable).parent / "skulk-llama-server", "cuda", directory / "site")
    env: dict[str, str] = {}
    resolved = export_managed_llama_server(env, [tmp_path])
    assert resolved is not None and (resolved.source, resolved.backend) == ("bundled", "cuda")
    assert env[SITE_ENV] == str(directory / "site") and env["SKULK_LLAMA_SERVER_MANAGED_BACKEND"] == "cuda"


def test_a_wheel_that_sees_no_gpu_is_not_used(tmp_path):
    version = xllamacpp_version()
    if version is None or find_bundled_server() is None:
        pytest.skip("xllamacpp is not installed on this platform")
    directory = _wheel_dir(tmp_path, version, "cuda", "CPU-only")
    (directory / "site" / "xllamacpp" / "__init__.py").write_text("def get_device_info():\n    return [{'name': 'CPU', 'type': 'CPU'}]\n")
    found = find_bundled_server([tmp_path])
    assert found is not None and (found.backend, found.site) == ("cpu", None)


def test_a_wheel_ready_in_the_background_is_adopted(tmp_path):
    wheel = WheelInstall(tmp_path / "xllamacpp-2-cuda", "2", "cuda")
    env = {"SKULK_LLAMA_SERVER_BIN": "/venv/bin/skulk-llama-server", "SKULK_LLAMA_SERVER_SOURCE": "bundled",
           "SKULK_LLAMA_SERVER_MANAGED_BACKEND": "cpu"}
    assert adopt_install(env, wheel)
    assert (env[SITE_ENV], env["SKULK_LLAMA_SERVER_MANAGED_BACKEND"]) == (str(wheel.site), "cuda")
    # A native CPU build finishing later does not take the GPU away.
    assert not adopt_install(env, ManagedInstall(tmp_path / "n", "1", "cpu"))
