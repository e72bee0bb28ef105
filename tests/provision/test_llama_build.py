from pathlib import Path

import pytest

from skulk.provision.llama_build import (
    BuildPlan,
    SdistPin,
    build_cache_root,
    build_progress,
    detect_backend,
    engine_search_dirs,
    engines_dir,
    sdist_pin_from_lock,
    sdist_pin_from_registry,
)
from skulk.shared.types.node_facts import GpuFact, NodeFacts

NVIDIA = GpuFact(vendor="nvidia", name="NVIDIA H200", vram_total_bytes=141 * 10**9, detected_by="nvml")
AMD = GpuFact(vendor="amd", name="AMD GPU card0", detected_by="sysfs")
INTEL = GpuFact(vendor="intel", name="INTEL GPU card0", detected_by="sysfs")
APPLE = GpuFact(vendor="apple", name="Apple Silicon GPU", detected_by="apple_platform")

PIN = SdistPin(version="0.3.36", url="https://files.example/llama_cpp_python-0.3.36.tar.gz", sha256="ab" * 32)


@pytest.mark.parametrize(
    ("os", "machine", "gpus", "backend"),
    [
        ("linux", "x86_64", [], "cpu"),
        ("linux", "x86_64", [INTEL], "cpu"),
        ("linux", "x86_64", [NVIDIA], "cuda"),
        ("linux", "x86_64", [INTEL, NVIDIA], "cuda"),
        ("linux", "x86_64", [AMD], "vulkan"),
        ("darwin", "arm64", [APPLE], "metal"),
    ],
)
def test_detect_backend(os, machine, gpus, backend):
    assert detect_backend(NodeFacts(os=os, machine=machine, gpus=gpus)) == backend


LOCK = '''
[[package]]
name = "llama-cpp-python"
version = "0.3.35"
sdist = {{ url = "https://x/old.tar.gz", hash = "sha256:{}", size = 1 }}

[[package]]
name = "llama-cpp-python"
version = "0.3.36"
source = {{ registry = "https://pypi.org/simple" }}
dependencies = [
    {{ name = "numpy" }},
]
sdist = {{ url = "https://x/llama_cpp_python-0.3.36.tar.gz", hash = "sha256:{}", size = 76589250 }}

[[package]]
name = "numpy"
version = "0.3.36"
sdist = {{ url = "https://x/numpy.tar.gz", hash = "sha256:{}", size = 2 }}
'''.format("1" * 64, "2" * 64, "3" * 64)


@pytest.mark.parametrize(
    ("version", "expected"),
    [
        ("0.3.36", SdistPin("0.3.36", "https://x/llama_cpp_python-0.3.36.tar.gz", "2" * 64)),
        ("0.3.35", SdistPin("0.3.35", "https://x/old.tar.gz", "1" * 64)),
        ("9.9.9", None),
    ],
)
def test_sdist_pin_from_lock(version, expected):
    assert sdist_pin_from_lock(LOCK, "llama-cpp-python", version) == expected


def test_sdist_pin_from_registry_takes_the_sdist_not_a_wheel():
    release = {"urls": [
        {"packagetype": "bdist_wheel", "url": "https://x/w.whl", "digests": {"sha256": "9" * 64}},
        {"packagetype": "sdist", "url": "https://x/s.tar.gz", "digests": {"sha256": "8" * 64}},
    ]}
    assert sdist_pin_from_registry(release, "1.0") == SdistPin("1.0", "https://x/s.tar.gz", "8" * 64)
    assert sdist_pin_from_registry({"urls": []}, "1.0") is None


@pytest.mark.parametrize(
    ("line", "progress"),
    [
        ("[12/211] Building CXX object ggml.cpp.o\n", (12, 211)),
        ("[ 42%] Building CXX object x.o", (42, 100)),
        ("-- Configuring done", None),
        ("warning: [12/211] is not a step", None),
    ],
)
def test_build_progress(line, progress):
    assert build_progress(line) == progress


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, Path("/home/u/.cache/skulk/engines")),
        ({"XDG_CACHE_HOME": "/xdg"}, Path("/xdg/skulk/engines")),
        ({"SKULK_ENGINES_DIR": "/opt/engines"}, Path("/opt/engines")),
        ({"SKULK_ENGINES_DIR": "  "}, Path("/home/u/.cache/skulk/engines")),
    ],
)
def test_engines_dir_belongs_to_the_machine(env, expected):
    assert engines_dir(env, Path("/home/u")) == expected


@pytest.mark.parametrize(
    ("env", "data_home", "expected"),
    [
        # Whatever --data-dir says, the machine's dir comes first; the old per-data-dir place
        # is still searched for installs made before.
        ({}, Path("/srv/skulk"), (Path("/home/u/.cache/skulk/engines"), Path("/srv/skulk/engines"))),
        ({}, Path("/home/u/.cache/skulk"), (Path("/home/u/.cache/skulk/engines"),)),
        ({"SKULK_ENGINES_DIR": "/opt/e"}, Path("/srv/skulk"), (Path("/opt/e"),)),
    ],
)
def test_engine_search_dirs(env, data_home, expected):
    assert engine_search_dirs(env, Path("/home/u"), data_home) == expected


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, Path("/home/u/.cache/skulk/engines")),
        ({"XDG_CACHE_HOME": "/xdg"}, Path("/xdg/skulk/engines")),
        ({"SKULK_ENGINE_BUILD_CACHE": "/bc", "XDG_CACHE_HOME": "/xdg"}, Path("/bc")),
    ],
)
def test_build_cache_root(env, expected):
    assert build_cache_root(env, Path("/home/u")) == expected


@pytest.mark.parametrize(
    ("backend", "present", "absent"),
    [
        ("cpu", ["-DGGML_RPC=ON", "-DGGML_NATIVE=ON", "-DLLAMA_BUILD_SERVER=ON"], ["-DGGML_CUDA=ON"]),
        ("cuda", ["-DGGML_CUDA=ON", "-DGGML_RPC=ON"], ["-DGGML_VULKAN=ON"]),
        ("vulkan", ["-DGGML_VULKAN=ON"], ["-DGGML_CUDA=ON"]),
        ("metal", ["-DGGML_METAL=ON"], ["-DGGML_NATIVE=ON"]),
    ],
)
def test_plan_keys_cache_and_install_by_version_and_backend(backend, present, absent):
    plan = BuildPlan(pin=PIN, backend=backend, cache_root=Path("/c"), engines_dir=Path("/e"))
    assert plan.build_dir == Path(f"/c/0.3.36-{backend}/build")
    assert plan.install_dir == Path(f"/e/llama.cpp-0.3.36-{backend}")
    assert plan.sdist_path == Path("/c/sdist/llama_cpp_python-0.3.36.tar.gz")
    configure = plan.configure_command("Ninja")
    assert configure[:7] == ["cmake", "-S", f"/c/0.3.36-{backend}/src", "-B", f"/c/0.3.36-{backend}/build", "-G", "Ninja"]
    assert all(flag in configure for flag in present)
    assert not any(flag in configure for flag in absent)
    assert plan.build_command(2)[-3:] == ["--target", "llama-server", "ggml-rpc-server"]
