"""A real runner subprocess serving the tiny GGUF through llama-server: the server is the
runner's, and dies with it even when the runner is killed with SIGKILL."""

from __future__ import annotations

import os
import signal
import time

import psutil
import pytest
import pytest_asyncio

from skulk.worker.runner.messages import TaskAccepted
from skulk.worker.runner.supervisor import RunnerSupervisor
from tests.llama_server_kit import llama_servers_under, require_llama_server
from tests.worker.runner.test_supervisor import READY_TIMEOUT_S, Reports
from tests.worker.tiny_gguf import (
    LONG_PROMPT,
    RUNNER,
    prompt_params,
    text_task,
    tiny_gguf,  # noqa: F401  (fixture)
    tiny_gguf_card,
    tiny_instance,
)

pytestmark = pytest.mark.timeout(180)

ORPHAN_DEADLINE_S = 10.0
"""The kernel delivers the death signal at once; this bounds a loaded machine's scheduling."""


@pytest_asyncio.fixture
async def served_runner(tiny_gguf, monkeypatch):
    monkeypatch.setenv("SKULK_LLAMA_SERVER_BIN", str(require_llama_server()))
    card = tiny_gguf_card()
    reports = Reports()
    supervisor = RunnerSupervisor(
        instance=tiny_instance(card, context_token_limit=512, backend="llama_server-cpu", slots=4),
        runner_id=RUNNER, card=card, model_path=str(tiny_gguf), on_report=reports, n_threads=2,
    )
    await supervisor.start()
    servers: list[psutil.Process] = []
    try:
        yield supervisor, reports, servers
    finally:
        if not supervisor.exited:
            await supervisor.shutdown(timeout_s=5.0)
        for server in servers:  # never leave one behind, whatever the test asserted
            if server.is_running():
                server.kill()


async def test_kill_9_of_the_runner_leaves_no_llama_server(served_runner):
    supervisor, reports, servers = served_runner
    await reports.wait_for(lambda: reports.state() in ("Ready", "Failed"), READY_TIMEOUT_S)
    assert reports.state() == "Ready", reports.messages[-3:]
    servers.extend(llama_servers_under(supervisor.pid))
    assert len(servers) == 1

    task = text_task("served", prompt_params(LONG_PROMPT, temperature=0, max_tokens=400))
    supervisor.submit(task)
    await reports.wait_for(lambda: len(reports.payloads(task)) >= 3)
    # The runner reported 4 slots: the worker would admit four requests at once.
    assert ("Running", 1) in reports.statuses()
    # A fast machine may finish that stream before the kill lands: freeze the server and
    # have the runner accept a second request, which is then certainly in flight when the
    # runner dies (the kernel's SIGKILL ends a stopped server too).
    (server,) = servers
    server.suspend()
    held = text_task("held", prompt_params(LONG_PROMPT, temperature=0, max_tokens=400))
    supervisor.submit(held)
    await reports.wait_for(lambda: any(isinstance(m, TaskAccepted) for m in reports.of_task(held)))

    os.kill(supervisor.pid, signal.SIGKILL)
    deadline = time.monotonic() + ORPHAN_DEADLINE_S
    while server.is_running() and server.status() != psutil.STATUS_ZOMBIE and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not server.is_running() or server.status() == psutil.STATUS_ZOMBIE, "llama-server outlived its runner"
    await reports.wait_for(lambda: reports.terminal(held) is not None and reports.terminal(task) is not None)
    assert reports.payloads(held) == [] and reports.terminal(held).outcome == "failed"


async def test_a_clean_shutdown_stops_the_server(served_runner):
    supervisor, reports, servers = served_runner
    await reports.wait_for(lambda: reports.state() in ("Ready", "Failed"), READY_TIMEOUT_S)
    servers.extend(llama_servers_under(supervisor.pid))
    assert len(servers) == 1
    await supervisor.shutdown(timeout_s=15.0)
    assert not servers[0].is_running() or servers[0].status() == psutil.STATUS_ZOMBIE
