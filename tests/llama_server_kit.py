"""Finding the llama-server binary the served-engine tests run against.

`.ci/run` builds it once (`skulk engines install --backend cpu`, cached under
~/.cache/skulk/engines); a developer gets it the same way. The tests skip, naming how to get
one, only when no binary can be found: an explicit SKULK_LLAMA_SERVER_BIN, a managed
install, or the build cache of the llama-cpp-python version installed here."""

from __future__ import annotations

import os
import sys
from importlib.metadata import version
from pathlib import Path

import pytest

from skulk.datadir.paths import resolve_paths
from skulk.provision.llama_binary import choose_install, installed_engines, probe_version
from skulk.provision.llama_build import SERVER_BINARY, build_cache_root, engines_dir

HOW_TO_GET_ONE = "no llama-server binary: run `uv run skulk engines install --backend cpu` (or set SKULK_LLAMA_SERVER_BIN)"


def find_llama_server() -> Path | None:
    candidates: list[Path] = []
    if os.environ.get("SKULK_LLAMA_SERVER_BIN"):
        candidates.append(Path(os.environ["SKULK_LLAMA_SERVER_BIN"]).expanduser())
    data_home = resolve_paths(os.environ, sys.platform, Path.home()).data_home
    install = choose_install(installed_engines(engines_dir(os.environ, data_home)), version("llama-cpp-python"))
    if install is not None:
        candidates.append(install.server)
    candidates.append(build_cache_root(os.environ, Path.home()) / f"{version('llama-cpp-python')}-cpu" / "build" / "bin" / SERVER_BINARY)
    return next((c for c in candidates if c.is_file() and probe_version(c) is not None), None)


def require_llama_server() -> Path:
    found = find_llama_server()
    if found is None:
        pytest.skip(HOW_TO_GET_ONE)
    return found
