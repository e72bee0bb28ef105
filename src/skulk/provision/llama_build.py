"""What a managed llama.cpp build is: version, backend, source, cmake recipe, where it lives.

Everything here is pure data and pure functions over it, so each rule (which backend a
machine gets, which cmake flags a backend needs, where the build cache and the install go,
which sdist hash the lock pins, how far a ninja build has come) is a table test. The shell
that downloads, verifies, compiles and copies is `skulk.provision.llama_install`.

The source is the llama-cpp-python source distribution of the exact version the node runs
in-process: it vendors llama.cpp under vendor/llama.cpp, so the served engine and the
in-process engine read GGUF files with the same code. This module must never do I/O.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from skulk.shared.settings import setting
from skulk.shared.types.node_facts import NodeFacts

LlamaBackend = Literal["cpu", "cuda", "vulkan", "metal"]
LLAMA_BACKENDS: tuple[LlamaBackend, ...] = ("cpu", "cuda", "vulkan", "metal")

SOURCE_PACKAGE = "llama-cpp-python"
VENDORED_SOURCE_DIR = "vendor/llama.cpp"
"""Where llama.cpp sits inside the sdist (below its top-level 'llama_cpp_python-<v>/')."""

SERVER_BINARY = "llama-server"
RPC_BINARY = "ggml-rpc-server"
"""The rpc server's binary name in this llama.cpp (its cmake target has the same name)."""

BUILD_TARGETS: tuple[str, ...] = (SERVER_BINARY, RPC_BINARY)

MANIFEST_NAME = "skulk-engine.json"
"""Written beside the installed binaries: version, backend, sdist hash, build time."""

COMMON_CMAKE_FLAGS: tuple[str, ...] = (
    "-DCMAKE_BUILD_TYPE=Release",
    # Static: the installed binaries are self-contained, so an install is two files and
    # a manifest, and nothing depends on the build cache surviving.
    "-DBUILD_SHARED_LIBS=OFF",
    "-DLLAMA_BUILD_SERVER=ON",
    "-DLLAMA_BUILD_TOOLS=ON",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_APP=OFF",
    # No network at build or run time: no web UI download, no curl model fetching, no TLS.
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DGGML_RPC=ON",
)

BACKEND_CMAKE_FLAGS: Mapping[LlamaBackend, tuple[str, ...]] = {
    # Native: the build runs on the machine that serves (the cache is per machine).
    "cpu": ("-DGGML_NATIVE=ON",),
    "cuda": ("-DGGML_NATIVE=ON", "-DGGML_CUDA=ON"),
    "vulkan": ("-DGGML_NATIVE=ON", "-DGGML_VULKAN=ON"),
    "metal": ("-DGGML_METAL=ON", "-DGGML_METAL_EMBED_LIBRARY=ON"),
}


class EngineBuildError(Exception):
    """A managed build cannot proceed; the message says what to do."""


@dataclass(frozen=True)
class SdistPin:
    """The source archive and the sha256 it must have."""

    version: str
    url: str
    sha256: str

    @property
    def filename(self) -> str:
        return self.url.rsplit("/", 1)[-1]


@dataclass(frozen=True)
class BuildPlan:
    """One managed build: where its cache, its install and its binaries are."""

    pin: SdistPin
    backend: LlamaBackend
    cache_root: Path
    """Machine-wide build cache, outside any checkout (~/.cache/skulk/engines)."""
    engines_dir: Path
    """The node's engines dir, where installs go (~/.local/share/skulk/engines)."""

    @property
    def key(self) -> str:
        return f"{self.pin.version}-{self.backend}"

    @property
    def sdist_path(self) -> Path:
        return self.cache_root / "sdist" / self.pin.filename

    @property
    def source_dir(self) -> Path:
        return self.cache_root / self.key / "src"

    @property
    def build_dir(self) -> Path:
        return self.cache_root / self.key / "build"

    @property
    def install_dir(self) -> Path:
        return install_dir_for(self.engines_dir, self.pin.version, self.backend)

    def built_binary(self, name: str) -> Path:
        return self.build_dir / "bin" / name

    def configure_command(self, generator: str | None) -> list[str]:
        command = ["cmake", "-S", str(self.source_dir), "-B", str(self.build_dir)]
        if generator:
            command += ["-G", generator]
        return command + list(COMMON_CMAKE_FLAGS) + list(BACKEND_CMAKE_FLAGS[self.backend])

    def build_command(self, jobs: int) -> list[str]:
        return ["cmake", "--build", str(self.build_dir), "-j", str(jobs), "--target", *BUILD_TARGETS]


def install_dir_for(engines_dir: Path, version: str, backend: str) -> Path:
    return engines_dir / f"llama.cpp-{version}-{backend}"


ENGINES_DIR_ENV = "SKULK_ENGINES_DIR"


def engines_dir(env: Mapping[str, str], home: Path) -> Path:
    """Where managed installs go and are found: SKULK_ENGINES_DIR, else
    $XDG_CACHE_HOME/skulk/engines (~/.cache/skulk/engines). A build belongs to the machine
    (it was compiled for this CPU and GPU), not to one node's data dir: every node on the
    machine finds it, whatever its --data-dir says."""
    configured = setting(ENGINES_DIR_ENV, env)
    if configured:
        return Path(configured).expanduser()
    xdg = env.get("XDG_CACHE_HOME", "").strip()
    return (Path(xdg) if xdg else home / ".cache") / "skulk" / "engines"


def engine_search_dirs(env: Mapping[str, str], home: Path, data_home: Path) -> tuple[Path, ...]:
    """The directories a node looks for managed installs in: the machine's engines dir,
    then (unless SKULK_ENGINES_DIR names one) <data home>/engines, where installs made before
    builds belonged to the machine still sit."""
    machine = engines_dir(env, home)
    if setting(ENGINES_DIR_ENV, env):
        return (machine,)
    legacy = data_home / "engines"
    return (machine,) if legacy == machine else (machine, legacy)


def build_cache_root(env: Mapping[str, str], home: Path) -> Path:
    """SKULK_ENGINE_BUILD_CACHE, else $XDG_CACHE_HOME/skulk/engines (~/.cache/...): shared by
    every node and checkout on the machine, so a second install of a version is a copy."""
    configured = setting("SKULK_ENGINE_BUILD_CACHE", env)
    if configured:
        return Path(configured).expanduser()
    xdg = env.get("XDG_CACHE_HOME", "").strip()
    return (Path(xdg) if xdg else home / ".cache") / "skulk" / "engines"


def detect_backend(facts: NodeFacts) -> LlamaBackend:
    """The backend a machine gets when the operator names none: its GPU's lane, else cpu.
    The same vendor -> compute lanes the node advertises (NVIDIA cuda, AMD vulkan, Apple
    metal); Intel GPUs are never inferred (an integrated one is no serving accelerator)."""
    if facts.is_apple_silicon():
        return "metal"
    vendors = facts.gpu_vendors()
    if "nvidia" in vendors:
        return "cuda"
    if "amd" in vendors:
        return "vulkan"
    return "cpu"


_LOCK_PACKAGE_RE = re.compile(r'^\[\[package\]\]\s*$', re.MULTILINE)
_LOCK_SDIST_RE = re.compile(r'^sdist = \{ url = "([^"]+)", hash = "sha256:([0-9a-f]{64})"', re.MULTILINE)


def sdist_pin_from_lock(lock_text: str, package: str, version: str) -> SdistPin | None:
    """The sdist url and sha256 uv.lock records for `package==version`, or None."""
    for block in _LOCK_PACKAGE_RE.split(lock_text):
        if f'name = "{package}"' in block and f'version = "{version}"' in block:
            match = _LOCK_SDIST_RE.search(block)
            if match:
                return SdistPin(version=version, url=match.group(1), sha256=match.group(2))
    return None


def sdist_pin_from_registry(release_json: Mapping, version: str) -> SdistPin | None:
    """The sdist in PyPI's JSON for one release (`/pypi/<name>/<version>/json`), or None."""
    for entry in release_json.get("urls", ()):
        if entry.get("packagetype") == "sdist" and entry.get("digests", {}).get("sha256"):
            return SdistPin(version=version, url=entry["url"], sha256=entry["digests"]["sha256"])
    return None


_NINJA_PROGRESS_RE = re.compile(r"^\[(\d+)/(\d+)\]")
_MAKE_PROGRESS_RE = re.compile(r"^\[\s*(\d+)%\]")


def build_progress(line: str) -> tuple[int, int] | None:
    """(done, total) from one line of build output: ninja's '[12/211] ...' or make's
    '[ 42%] ...' (as done/100); None for any other line."""
    if match := _NINJA_PROGRESS_RE.match(line):
        return int(match.group(1)), int(match.group(2))
    if match := _MAKE_PROGRESS_RE.match(line):
        return int(match.group(1)), 100
    return None


__all__ = [
    "BACKEND_CMAKE_FLAGS",
    "BUILD_TARGETS",
    "COMMON_CMAKE_FLAGS",
    "ENGINES_DIR_ENV",
    "LLAMA_BACKENDS",
    "MANIFEST_NAME",
    "RPC_BINARY",
    "SERVER_BINARY",
    "SOURCE_PACKAGE",
    "VENDORED_SOURCE_DIR",
    "BuildPlan",
    "EngineBuildError",
    "LlamaBackend",
    "SdistPin",
    "build_cache_root",
    "build_progress",
    "detect_backend",
    "engine_search_dirs",
    "engines_dir",
    "install_dir_for",
    "sdist_pin_from_lock",
    "sdist_pin_from_registry",
]
