"""A real runner subprocess on the tiny GGUF, driven through its supervisor: start-up,
streaming in lifecycle order, cancellation, clean shutdown, and crashes that must never
leave a client stream hanging."""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import signal
import threading
import time
from collections.abc import Callable

import psutil
import pytest
import pytest_asyncio

from skulk.shared.types.chunks import ResultChunk, StreamPayload, StreamStarted, StreamTerminal, TokenChunk
from skulk.shared.types.ids import CommandId, ModelId, TaskId
from skulk.shared.types.instances import RunnerStatus
from skulk.shared.types.tasks import EmbeddingParams, TextGeneration, WorkloadTask
from skulk.shared.types.workload_io import EmbeddingResult
from skulk.worker.runner import supervisor as supervisor_module
from skulk.worker.runner.bootstrap import PARENT_WATCH_INTERVAL_S, runner_main
from skulk.worker.runner.messages import Frame, StatusChanged, TaskAccepted, TaskDone, pack
from skulk.worker.runner.supervisor import RunnerSupervisor
from tests.worker.tiny_gguf import (
    INSTANCE,
    LONG_PROMPT,
    LONG_TOKENS,
    OWNER,
    RUNNER,
    prompt_params,
    text_task,
    tiny_gguf,  # noqa: F401  (fixture)
    tiny_gguf_card,
    tiny_instance,
)

pytestmark = pytest.mark.timeout(120)

READY_TIMEOUT_S = 60.0
"""Spawn, imports (pydantic, llama_cpp) and loading the tiny model, on a busy 2-core box."""
STEP_TIMEOUT_S = 20.0
HANG_GUARD_S = 60.0
"""How long a test waits for a crash report or a clean exit before it fails as hung: a guard
against a wait that never ends, not a speed bound (no timed assertions: machines vary)."""

LONG = prompt_params(LONG_PROMPT, temperature=0, max_tokens=LONG_TOKENS)
"""Seconds of decoding, never ended early by the model: a test can act in the middle of it."""


class Reports:
    """Everything the supervisor reported, in order, with deadline-bounded waiting."""

    def __init__(self) -> None:
        self.messages: list = []
        self._changed = asyncio.Event()

    def __call__(self, message) -> None:
        self.messages.append(message)
        self._changed.set()

    async def wait_for(self, predicate: Callable[[], object], timeout_s: float = STEP_TIMEOUT_S) -> object:
        deadline = time.monotonic() + timeout_s
        while True:
            result = predicate()
            if result:
                return result
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"hung: not reported within {timeout_s}s; last reports: {self.messages[-6:]}")
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(), remaining)
            except TimeoutError:
                pass

    def statuses(self) -> list[tuple[str, int]]:
        return [(m.status.state, m.in_flight) for m in self.messages if isinstance(m, StatusChanged)]

    def state(self) -> str | None:
        states = self.statuses()
        return states[-1][0] if states else None

    def of_task(self, task: TextGeneration) -> list:
        """The task's own messages: TaskAccepted, its frames, TaskDone."""
        return [
            m for m in self.messages
            if (isinstance(m, (TaskAccepted, TaskDone)) and m.task_id == task.task_id)
            or (isinstance(m, Frame) and m.frame.command_id == task.command_id)
        ]

    def done(self, task: TextGeneration) -> TaskDone | None:
        return next((m for m in self.of_task(task) if isinstance(m, TaskDone)), None)

    def payloads(self, task: TextGeneration) -> list[StreamPayload]:
        return [m.frame for m in self.of_task(task) if isinstance(m, Frame) and isinstance(m.frame, StreamPayload)]

    def terminal(self, task: TextGeneration) -> StreamTerminal | None:
        return next(
            (m.frame for m in self.of_task(task) if isinstance(m, Frame) and isinstance(m.frame, StreamTerminal)), None
        )


@pytest_asyncio.fixture
async def spawn(tiny_gguf):
    """Start supervised runners; every one is shut down (or killed) at teardown."""
    started: list[RunnerSupervisor] = []

    async def start(*, backend: str = "llama_cpp-cpu", **kwargs) -> tuple[RunnerSupervisor, Reports]:
        card = tiny_gguf_card()
        reports = Reports()
        supervisor = RunnerSupervisor(
            instance=tiny_instance(card, backend=backend),
            runner_id=RUNNER,
            card=card,
            model_path=str(tiny_gguf),
            on_report=reports,
            n_threads=1,
            **kwargs,
        )
        started.append(supervisor)
        await supervisor.start()
        return supervisor, reports

    yield start
    for supervisor in started:
        if not supervisor.exited:
            await supervisor.shutdown(timeout_s=2.0)


async def start_ready(spawn) -> tuple[RunnerSupervisor, Reports]:
    supervisor, reports = await spawn()
    await reports.wait_for(lambda: reports.state() in ("Ready", "Failed"), READY_TIMEOUT_S)
    assert reports.state() == "Ready", reports.statuses()
    return supervisor, reports


async def test_runner_loads_to_ready_and_streams_in_lifecycle_order(spawn) -> None:
    supervisor, reports = await start_ready(spawn)
    assert reports.statuses() == [("Loading", 0), ("Loaded", 0), ("WarmingUp", 0), ("Ready", 0)]
    assert supervisor.status.state == "Ready"

    task = text_task("lifecycle", prompt_params("The weather today is", temperature=0, max_tokens=12))
    supervisor.submit(task)
    assert supervisor.in_flight == 1
    await reports.wait_for(lambda: reports.done(task))

    messages = reports.of_task(task)
    assert isinstance(messages[0], TaskAccepted)
    frames = [m for m in messages if isinstance(m, Frame)]
    assert all(f.owner_node_id == OWNER for f in frames)
    started, *payloads, terminal = [f.frame for f in frames]
    assert isinstance(started, StreamStarted) and started.seq == 0 and started.runner_id == RUNNER
    assert [p.seq for p in payloads] == list(range(1, 13))
    chunks = [p.chunk for p in payloads]
    assert all(isinstance(c, TokenChunk) and c.command_id == task.command_id for c in chunks)
    assert all(c.finish_reason is None and c.usage is None for c in chunks[:-1])
    assert chunks[-1].finish_reason == "length"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 12
    assert "".join(c.text for c in chunks).strip()
    assert isinstance(terminal, StreamTerminal) and terminal.seq == 13 and terminal.outcome == "completed"
    assert messages[-1] == TaskDone(task_id=task.task_id, outcome="completed")

    await reports.wait_for(lambda: reports.statuses()[-1] == ("Ready", 0))
    statuses = reports.statuses()
    assert ("Running", 1) in statuses[4:]
    # Ready comes back only after the task's TaskDone.
    done_at = reports.messages.index(messages[-1])
    last_ready = max(i for i, m in enumerate(reports.messages) if isinstance(m, StatusChanged))
    assert last_ready > done_at
    assert supervisor.in_flight == 0


async def test_an_embedding_task_streams_one_embedding_chunk_and_logprobs_ride_token_chunks(spawn) -> None:
    supervisor, reports = await start_ready(spawn)
    task = WorkloadTask(
        task_id=TaskId("task-embed"), instance_id=INSTANCE, command_id=CommandId("cmd-embed"), owner_node_id=OWNER,
        params=EmbeddingParams(model_id=ModelId("local/tiny-llama-gguf"), inputs=["the weather", "a cat"]),
    )
    supervisor.submit(task)
    await reports.wait_for(lambda: reports.done(task))
    (payload,) = reports.payloads(task)
    chunk = payload.chunk
    assert isinstance(chunk, ResultChunk) and isinstance(chunk.result, EmbeddingResult)
    vectors = chunk.result.embeddings
    assert len(vectors) == 2 and vectors[0] != vectors[1]
    assert all(abs(sum(x * x for x in vector) - 1.0) < 1e-3 for vector in vectors)  # unit length  # unit length
    assert chunk.usage is not None and chunk.usage.prompt_tokens >= 4
    assert reports.terminal(task).outcome == "completed"

    # The generation context is whole again after the embedding borrowed it.
    scored = text_task("scored", prompt_params("The weather today is", temperature=0, max_tokens=3,
                                               logprobs=True, top_logprobs=2))
    supervisor.submit(scored)
    await reports.wait_for(lambda: reports.done(scored))
    chunks = [p.chunk for p in reports.payloads(scored)]
    assert len(chunks) == 3 and all(c.logprob is not None and c.logprob <= 0 for c in chunks)
    assert all(len(c.top_logprobs) == 2 for c in chunks)


async def test_cancel_mid_stream_ends_with_a_cancelled_terminal(spawn) -> None:
    supervisor, reports = await start_ready(spawn)
    task = text_task("cancel", LONG)
    supervisor.submit(task)
    await reports.wait_for(lambda: reports.payloads(task))
    supervisor.cancel(task.task_id)
    supervisor.cancel(task.task_id)  # idempotent
    await reports.wait_for(lambda: reports.done(task))

    payloads = reports.payloads(task)
    terminal = reports.terminal(task)
    assert terminal is not None and terminal.outcome == "cancelled"
    assert terminal.seq == payloads[-1].seq + 1
    assert len(payloads) < LONG.max_tokens
    assert reports.done(task) == TaskDone(task_id=task.task_id, outcome="cancelled")
    supervisor.cancel(task.task_id)  # after the end: a no-op
    await reports.wait_for(lambda: reports.statuses()[-1] == ("Ready", 0))

    # The runner serves the next request normally.
    after = text_task("after-cancel", prompt_params("Hello", temperature=0, max_tokens=3))
    supervisor.submit(after)
    await reports.wait_for(lambda: reports.done(after))
    assert reports.done(after).outcome == "completed"


async def test_shutdown_is_clean_and_ends_in_flight_work(spawn) -> None:
    supervisor, reports = await start_ready(spawn)
    task = text_task("shutdown", LONG)
    supervisor.submit(task)
    await reports.wait_for(lambda: reports.payloads(task))

    # Exit code 0: the runner exited by itself, before the supervisor's kill fallback
    # (which would leave -SIGTERM or -SIGKILL); the long timeout only guards against a hang.
    code = await supervisor.shutdown(timeout_s=HANG_GUARD_S)
    assert code == 0
    assert supervisor.exited and not supervisor.stats().alive

    terminal = reports.terminal(task)
    assert terminal is not None and (terminal.outcome, terminal.error_type) == ("failed", "RunnerShutdown")
    assert reports.done(task).outcome == "failed"
    states = [state for state, _ in reports.statuses()]
    assert states[-2:] == ["ShuttingDown", "Shutdown"]
    assert supervisor.status.state == "Shutdown"
    assert supervisor.in_flight == 0
    assert supervisor.stats().crashes == 0


async def test_an_idle_runner_blocked_on_its_inbox_still_ends_on_sigterm(spawn) -> None:
    # Idle, with no TTL, the runner's main thread blocks on its inbox with no timeout; the
    # SIGTERM is relayed into it. Exit code 0: the runner shut down by itself (SIGTERM's
    # default action would leave -15); the wait only guards against a hang.
    supervisor, reports = await start_ready(spawn)
    os.kill(supervisor.pid, signal.SIGTERM)
    await reports.wait_for(lambda: supervisor.exited, HANG_GUARD_S)
    assert supervisor.exitcode == 0
    assert "ShuttingDown" in [state for state, _ in reports.statuses()]


async def test_killed_runner_fails_its_streams_and_reports_failed(spawn) -> None:
    supervisor, reports = await start_ready(spawn)
    task = text_task("killed", LONG)
    supervisor.submit(task)
    await reports.wait_for(lambda: reports.payloads(task))

    os.kill(supervisor.pid, signal.SIGKILL)
    # The stream ends with the crash (not a timeout of ours): the hang guard is generous.
    await reports.wait_for(lambda: reports.done(task) and reports.state() == "Failed", HANG_GUARD_S)

    payloads = reports.payloads(task)
    terminal = reports.terminal(task)
    assert terminal is not None
    assert (terminal.outcome, terminal.error_type) == ("failed", "RunnerCrashed")
    assert terminal.seq == payloads[-1].seq + 1
    done = reports.done(task)
    assert done.outcome == "failed" and "code -9" in (done.error_message or "")
    assert done.error_type == "RunnerCrashed"  # the same cause as the terminal: State carries it too
    # The terminal comes before TaskDone, and Failed is the last word.
    order = [type(m).__name__ for m in reports.of_task(task)]
    assert order[-2:] == ["Frame", "TaskDone"]
    last = reports.messages[-1]
    assert isinstance(last, StatusChanged) and last.status.state == "Failed"
    assert last.status.error_message.startswith("runner exited with code -9")
    stats = supervisor.stats()
    assert (stats.crashes, stats.alive, stats.in_flight, stats.exitcode) == (1, False, 0, -9)

    # A task submitted to a dead runner ends at once instead of waiting forever.
    late = text_task("late", prompt_params("Hello", max_tokens=2))
    supervisor.submit(late)
    await reports.wait_for(lambda: reports.done(late), 1.0)
    kinds = [type(m.frame).__name__ for m in reports.of_task(late) if isinstance(m, Frame)]
    assert kinds == ["StreamStarted", "StreamTerminal"]
    assert reports.terminal(late).error_type == "RunnerUnavailable"
    assert reports.done(late).error_type == "RunnerUnavailable"


async def test_silent_runner_is_killed_at_the_first_status_deadline(spawn) -> None:
    # No runner can report within 10 ms of spawn, so this stands in for one frozen at start-up.
    supervisor, reports = await spawn(first_status_deadline_s=0.01)
    task = text_task("early", prompt_params("Hello", max_tokens=2))
    supervisor.submit(task)
    await reports.wait_for(lambda: reports.state() == "Failed", HANG_GUARD_S)
    await supervisor.shutdown(timeout_s=1.0)  # what the worker does on Failed
    assert supervisor.exited

    failed = [m for m in reports.messages if isinstance(m, StatusChanged)]
    assert len(failed) == 1 and failed[0].status.state == "Failed"
    assert "no status within 0.01s" in failed[0].status.error_message
    assert reports.terminal(task).error_type == "RunnerCrashed"
    assert reports.done(task).outcome == "failed"
    assert supervisor.stats().crashes == 1


async def test_unknown_engine_fails_the_runner_with_its_reason(spawn) -> None:
    supervisor, reports = await spawn(backend="mlx_audio-metal")
    await reports.wait_for(lambda: supervisor.exited, READY_TIMEOUT_S)
    states = reports.statuses()
    assert states[0] == ("Loading", 0)
    assert states[-1][0] == "Failed"
    last = supervisor.status
    assert last.error_message.startswith("runner exited with code 1")
    assert "no engine for backend 'mlx_audio-metal'" in last.error_message


async def test_shutdown_escalates_to_kill_when_the_runner_does_not_respond(spawn, monkeypatch) -> None:
    monkeypatch.setattr(supervisor_module, "TERMINATE_TIMEOUT_S", 0.5)
    supervisor, reports = await start_ready(spawn)
    task = text_task("frozen", LONG)
    supervisor.submit(task)
    await reports.wait_for(lambda: reports.payloads(task))
    os.kill(supervisor.pid, signal.SIGSTOP)  # frozen: ignores ShutdownRunner and SIGTERM alike

    # The SIGKILL exit code proves the escalation; the outer wait only guards against a hang.
    code = await asyncio.wait_for(supervisor.shutdown(timeout_s=0.5), HANG_GUARD_S)
    assert code == -signal.SIGKILL
    assert supervisor.status.state == "Shutdown"
    terminal = reports.terminal(task)
    assert terminal is not None and (terminal.outcome, terminal.error_type) == ("failed", "RunnerShutdown")
    assert reports.done(task).outcome == "failed"
    assert supervisor.stats().crashes == 0


def _orphaning_parent(report) -> None:
    """A stand-in worker: starts a runner, reports its pid, then waits to be killed."""
    ctx = mp.get_context("spawn")
    _reader, writer = ctx.Pipe(duplex=False)
    runner = ctx.Process(target=runner_main, args=(ctx.Queue(), writer, os.getpid()), daemon=True)
    runner.start()
    report.put(runner.pid)
    threading.Event().wait(120)


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_runner_exits_when_its_parent_dies() -> None:
    ctx = mp.get_context("spawn")
    report = ctx.Queue()
    parent = ctx.Process(target=_orphaning_parent, args=(report,))
    parent.start()
    runner_pid = None
    try:
        runner_pid = report.get(timeout=STEP_TIMEOUT_S)
        assert not _gone(runner_pid)
        os.kill(parent.pid, signal.SIGKILL)  # no atexit: only the runner's own watchdog can act
        parent.join(STEP_TIMEOUT_S)
        deadline = time.monotonic() + PARENT_WATCH_INTERVAL_S + STEP_TIMEOUT_S
        while not _gone(runner_pid):
            assert time.monotonic() < deadline, "orphaned runner is still alive"
            time.sleep(0.05)
    finally:
        if parent.is_alive():
            parent.kill()
        if runner_pid is not None and not _gone(runner_pid):
            os.kill(runner_pid, signal.SIGKILL)


BIG_TEXT_CHARS = 3 * supervisor_module.READ_CHUNK_BYTES + 17
"""A message several pipe reads long: it must be gathered over wake-ups, never read blocking."""


def _runner_with_big_output(_inbox, outbox, _parent_pid) -> None:
    """A stand-in runner: one message far longer than a read, a last status, then exit 3."""
    outbox.send_bytes(pack(StatusChanged(status=RunnerStatus(state="Loading"))))
    chunk = TokenChunk(command_id="big", text="x" * BIG_TEXT_CHARS)
    outbox.send_bytes(pack(Frame(owner_node_id=OWNER, frame=StreamPayload(command_id="big", seq=1, chunk=chunk))))
    outbox.send_bytes(pack(StatusChanged(status=RunnerStatus(state="Failed", error_message="gave up"))))
    os._exit(3)


def _runner_cut_mid_message(_inbox, outbox, _parent_pid) -> None:
    """A stand-in runner killed mid-message: a length promising 1 MiB, 100 bytes of it, exit."""
    outbox.send_bytes(pack(StatusChanged(status=RunnerStatus(state="Loading"))))
    os.write(outbox.fileno(), (1 << 20).to_bytes(4, "big") + b"\x80" * 100)
    os._exit(9)


async def stand_in_exited(supervisor: RunnerSupervisor, reports: Reports) -> None:
    """Wait for a stand-in runner to start (a spawned interpreter importing this module: as
    slow as a real runner's start on a loaded box) and then for its exit to be reported."""
    await reports.wait_for(lambda: reports.messages or supervisor.exited, READY_TIMEOUT_S)
    await reports.wait_for(lambda: supervisor.exited, HANG_GUARD_S)


async def test_a_message_longer_than_a_read_arrives_whole_before_the_exit(spawn, monkeypatch) -> None:
    monkeypatch.setattr(supervisor_module, "runner_main", _runner_with_big_output)
    supervisor, reports = await spawn()
    await stand_in_exited(supervisor, reports)
    frames = [m.frame for m in reports.messages if isinstance(m, Frame)]
    assert len(frames) == 1 and len(frames[0].chunk.text) == BIG_TEXT_CHARS
    statuses = [m.status for m in reports.messages if isinstance(m, StatusChanged)]
    assert [(s.state, s.error_message) for s in statuses[:2]] == [("Loading", None), ("Failed", "gave up")]
    assert supervisor.status.error_message == "runner exited with code 3: gave up"


async def test_a_runner_cut_off_mid_message_is_reported_gone(spawn, monkeypatch) -> None:
    monkeypatch.setattr(supervisor_module, "runner_main", _runner_cut_mid_message)
    supervisor, reports = await spawn()
    await stand_in_exited(supervisor, reports)
    assert [state for state, _ in reports.statuses()] == ["Loading", "Failed"]
    assert supervisor.status.error_message == "runner exited with code 9"
