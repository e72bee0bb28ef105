"""The node's background build of a native llama-server: the shell around
`skulk.provision.autoprovision` (which decides) and `skulk engines install` (which builds).

The build runs as its own process (`python -m skulk engines install --progress-json`) at the
lowest CPU priority, so serving keeps the cores it needs; the node reads its progress lines
into an `EngineProvision` that telemetry carries to /state and the dashboard. The process
belongs to the node: cancelling `run` stops it (SIGTERM, which unwinds through the
compiler's process group; SIGKILL after a grace period), and the kernel stops it if the node
dies. Every wait is bounded (`BUILD_DEADLINE_S`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import signal
import sys
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from skulk.provision.autoprovision import (
    BuildInBackground,
    NoBuild,
    autoprovision_decision,
    missing_tools,
    provision_after_line,
    provision_ended,
)
from skulk.provision.gpu_wheel import WheelInstall, choose_wheel
from skulk.provision.llama_binary import ManagedInstall, installed_engines, installed_wheels
from skulk.provision.llama_build import detect_backend
from skulk.provision.node_engine import llama_cpp_version, managed_install, server_source, xllamacpp_version
from skulk.shared.types.node_facts import NodeFacts
from skulk.shared.types.telemetry import EngineProvision

log = logging.getLogger(__name__)

BUILD_DEADLINE_S = 4 * 3600.0
"""A build still running after this is stopped and reported failed."""
STOP_GRACE_S = 10.0
ERROR_TAIL_LINES = 6
NICENESS = 19


def decide_background_install(
    env: Mapping[str, str], facts: NodeFacts, *, worker_enabled: bool, search_dirs: Sequence[Path],
    which: Callable[[str], str | None] = shutil.which,
) -> BuildInBackground | NoBuild:
    """Observe what the pure decision needs (installed builds, the toolchain) and decide."""
    backend = detect_backend(facts)
    version, wheel_version = llama_cpp_version(), xllamacpp_version()
    installed = {
        install.backend
        for directory in search_dirs
        for install in installed_engines(directory)
        if version is None or install.version == version
    } | {
        wheel.backend
        for directory in search_dirs
        for wheel in installed_wheels(directory)
        if wheel.version == wheel_version
    }
    return autoprovision_decision(
        env, override=server_source(env) == "override", worker_enabled=worker_enabled, backend=backend,
        installed_backends=installed, missing=missing_tools(backend, which),
        wheel_possible=facts.os == "linux" and wheel_version is not None,
    )


def _lowest_priority() -> None:
    os.nice(NICENESS)


class BackgroundInstall:
    """One background build; `status` is what the node reports (None: nothing to report)."""

    def __init__(self, decision: BuildInBackground | NoBuild, search_dirs: Sequence[Path], jobs: int | None = None) -> None:
        self.decision = decision
        self.search_dirs = tuple(search_dirs)
        self.jobs = jobs or max(1, os.cpu_count() or 1)
        self.status: EngineProvision | None = (
            EngineProvision(state="building", backend=decision.backend, step="start")
            if isinstance(decision, BuildInBackground) else decision.shown
        )

    @property
    def wanted(self) -> bool:
        return isinstance(self.decision, BuildInBackground)

    def command(self) -> list[str]:
        assert isinstance(self.decision, BuildInBackground)
        return [sys.executable, "-m", "skulk", "engines", "install", "--backend", self.decision.backend,
                "--jobs", str(self.jobs), "--progress-json", *(["--wheel"] if self.decision.wheel else [])]

    async def run(self, on_ready: Callable[[ManagedInstall | WheelInstall], object]) -> None:
        """Build; on success call `on_ready` (the node adopts the build for new placements)."""
        if not self.wanted or self.status is None:
            return
        log.info("installing a faster llama-server in the background (%s): %s", self.status.backend,
                 " ".join(self.command()))
        process = await asyncio.create_subprocess_exec(
            *self.command(), stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, start_new_session=True, preexec_fn=_lowest_priority,
        )
        tail: deque[str] = deque(maxlen=ERROR_TAIL_LINES)
        try:
            async with asyncio.timeout(BUILD_DEADLINE_S):
                await asyncio.gather(self._read_progress(process), self._read_errors(process, tail))
                code = await process.wait()
        except TimeoutError:
            await self._stop(process)
            code = -1
            tail.append(f"stopped after {BUILD_DEADLINE_S:g}s")
        except BaseException:
            await self._stop(process)
            raise
        installed = self._installed() if code == 0 else None
        where = None if installed is None else str(getattr(installed, "server", None) or installed.directory)
        self.status = provision_ended(self.status, code, where, " ".join(tail))
        if installed is not None and self.status.state == "ready":
            log.info("background llama-server build ready: %s", where)
            on_ready(installed)
        else:
            log.warning("background llama-server build failed: %s", self.status.message)

    def _installed(self) -> ManagedInstall | WheelInstall | None:
        if isinstance(self.decision, BuildInBackground) and self.decision.wheel:
            wheels = [wheel for directory in self.search_dirs for wheel in installed_wheels(directory)]
            return choose_wheel([w for w in wheels if w.backend == self.decision.backend], xllamacpp_version())
        return managed_install(self.search_dirs)

    async def _read_progress(self, process: asyncio.subprocess.Process) -> None:
        assert process.stdout is not None
        async for raw in process.stdout:
            if self.status is not None:
                self.status = provision_after_line(self.status, raw.decode("utf-8", "replace"))

    @staticmethod
    async def _read_errors(process: asyncio.subprocess.Process, tail: deque[str]) -> None:
        assert process.stderr is not None
        async for raw in process.stderr:
            line = raw.decode("utf-8", "replace").strip()
            if line:
                tail.append(line[:400])

    @staticmethod
    async def _stop(process: asyncio.subprocess.Process) -> None:
        if process.returncode is not None:
            return
        try:
            os.killpg(process.pid, signal.SIGTERM)
            async with asyncio.timeout(STOP_GRACE_S):
                await process.wait()
        except TimeoutError:
            os.killpg(process.pid, signal.SIGKILL)
            await process.wait()
        except ProcessLookupError:
            pass


__all__ = ["BUILD_DEADLINE_S", "BackgroundInstall", "decide_background_install"]
