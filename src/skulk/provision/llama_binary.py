"""Which llama-server a node uses, and whether it answers.

Precedence: SKULK_LLAMA_SERVER_BIN (an operator's override always wins, and an invalid one
is never masked by a managed build), then the managed install in the engines dir built from
the llama-cpp-python version this node runs, GPU builds before the CPU one. `choose_install`
is the pure rule; `probe_version` and `installed_engines` are the only I/O.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from skulk.provision.gpu_wheel import SITE_DIR, WHEEL_KIND, WheelInstall
from skulk.provision.llama_build import MANIFEST_NAME, RPC_BINARY, SERVER_BINARY

VERSION_PROBE_TIMEOUT_S = 15.0
"""`llama-server --version` prints and exits at once; a binary silent past this is broken
(a static binary loads no model for --version, so even a loaded machine answers in time)."""

BACKEND_PREFERENCE: tuple[str, ...] = ("cuda", "vulkan", "metal", "cpu")
"""Among installs of one version, the first backend found serves: a GPU build a node has
bothered to install is the one it means to use."""


@dataclass(frozen=True)
class ManagedInstall:
    directory: Path
    version: str
    backend: str

    @property
    def server(self) -> Path:
        return self.directory / "bin" / SERVER_BINARY

    @property
    def rpc_server(self) -> Path:
        return self.directory / "bin" / RPC_BINARY


def installed_engines(engines_dir: Path) -> list[ManagedInstall]:
    """Every complete managed install under `engines_dir` (a manifest names it)."""
    found: list[ManagedInstall] = []
    try:
        entries = sorted(engines_dir.iterdir())
    except OSError:
        return []
    for entry in entries:
        data = _manifest(entry)
        if data is not None and data.get("kind", "native") == "native":
            found.append(ManagedInstall(entry, str(data["version"]), str(data["backend"])))
    return found


def installed_wheels(engines_dir: Path) -> list[WheelInstall]:
    """Every GPU wheel installed under `engines_dir` (`skulk engines install --wheel`)."""
    try:
        entries = sorted(engines_dir.iterdir())
    except OSError:
        return []
    found: list[WheelInstall] = []
    for entry in entries:
        data = _manifest(entry)
        if data is not None and data.get("kind") == WHEEL_KIND and (entry / SITE_DIR).is_dir():
            found.append(WheelInstall(entry, str(data["version"]), str(data["backend"])))
    return found


def _manifest(entry: Path) -> dict | None:
    try:
        data = json.loads((entry / MANIFEST_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and "version" in data and "backend" in data else None


def choose_install(installs: Sequence[ManagedInstall], version: str | None) -> ManagedInstall | None:
    """The install a node serves with: its own llama-cpp-python version, best backend."""
    matching = [i for i in installs if version is None or i.version == version]
    ranked = sorted(
        matching,
        key=lambda i: BACKEND_PREFERENCE.index(i.backend) if i.backend in BACKEND_PREFERENCE else len(BACKEND_PREFERENCE),
    )
    return ranked[0] if ranked else None


def probe_version(binary: Path | str, timeout_s: float = VERSION_PROBE_TIMEOUT_S,
                  env: Mapping[str, str] | None = None) -> str | None:
    """The binary's `--version` report (its 'version:' line, else its first line, else
    'exit 0'), or None when it does not answer: it cannot run, exits non-zero or hangs."""
    try:
        done = subprocess.run(
            [str(binary), "--version"], capture_output=True, text=True, timeout=timeout_s, check=False,
            env=None if env is None else dict(env),
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if done.returncode != 0:
        return None
    lines = [line.strip() for line in (done.stdout + "\n" + done.stderr).splitlines() if line.strip()]
    reported = [line for line in lines if line.startswith("version:")]
    return (reported or lines or ["exit 0"])[0]


__all__ = [
    "BACKEND_PREFERENCE",
    "VERSION_PROBE_TIMEOUT_S",
    "ManagedInstall",
    "choose_install",
    "installed_engines",
    "installed_wheels",
    "probe_version",
]
