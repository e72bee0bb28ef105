"""The parent side of one runner process: spawn, feed, watch, and end it.

One `RunnerSupervisor` per (instance, rank). It spawns `bootstrap.runner_main` in a
`multiprocessing` spawn-context daemon process with a bounded inbox queue and an outbox pipe,
sends `LoadShard`, and turns everything the runner says into `on_report(message)` calls on
the event loop, in the order the runner said it. The loop itself reads the runner's pipe
(non-blocking, `add_reader`) and delivers every complete message a wake-up finds in one
batch: no reader thread, so a token costs the node one wake-up and no thread hand-off.
It guarantees what the runner cannot: a runner that dies,
hangs before its first status, or is shut down never leaves a task without its terminal
frame and `TaskDone`, and never leaves its status stale.

It never decides whether to start, restart or give up on a runner (the worker's plan does,
consulting `breaker.CrashBreaker`), and it never blocks the event loop on the process.

Reports it adds to the runner's own (see `messages` for the runner's protocol):
- first-status deadline: a runner silent for `first_status_deadline_s` after spawn is
  reported `StatusChanged(Failed, ...)` and killed;
- unexpected exit (crash, kill -9, OOM): for each task still in flight, the frames it lacks
  (`StreamStarted` if none was seen, then `StreamTerminal(failed, RunnerCrashed)`) and
  `TaskDone(failed)`; then `StatusChanged(Failed, "runner exited with code N")`;
- exit after `shutdown()`: leftover tasks end failed with `RunnerShutdown`, then
  `StatusChanged(Shutdown)`;
- a task it cannot hand to the runner (not started, exited, shutting down, inbox full) ends
  at once with started + failed terminal (`RunnerUnavailable` / `RunnerBusy`) + TaskDone.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing as mp
import os
import queue
import signal
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from skulk.shared.types.cards import ModelCard
from skulk.shared.types.chunks import StreamPayload, StreamStarted, StreamTerminal
from skulk.shared.types.ids import CommandId, RunnerId, TaskId
from skulk.shared.types.instances import Instance, RunnerStatus
from skulk.shared.types.stream_errors import StreamErrorType
from skulk.shared.types.tasks import ApiTask
from skulk.worker.runner.bootstrap import runner_main
from skulk.worker.runner.messages import (
    Cancel,
    Frame,
    FromRunner,
    Generate,
    LoadShard,
    ShutdownRunner,
    StatusChanged,
    TaskAccepted,
    TaskDone,
    unpack,
)

log = logging.getLogger(__name__)

FIRST_STATUS_DEADLINE_S = 120.0
"""A runner must send its first status this long after spawn. A process frozen before that
(stuck import, wedged driver init) is alive, so no crash detection sees it; without this
deadline the instance would wait for it forever."""

SHUTDOWN_TIMEOUT_S = 10.0
"""Default time a runner gets to exit after `ShutdownRunner` before SIGTERM."""

TERMINATE_TIMEOUT_S = 5.0
"""Time between SIGTERM and SIGKILL during shutdown."""

KILL_TIMEOUT_S = 5.0
"""Time allowed for the kernel to reap a SIGKILLed runner before shutdown gives up waiting."""

EXIT_DRAIN_TIMEOUT_S = 1.0
"""Slack, after a SIGKILL's reaping, for the waiter thread's report to reach the loop and
the runner's last output to be delivered before the exit is reported."""

INBOX_CAPACITY = 256
"""Parent -> runner messages not yet read. Fills only while the runner is loading (it reads
continuously once serving); a Generate that finds it full is refused as RunnerBusy."""

READ_CHUNK_BYTES = 64 * 1024
"""Most bytes the loop reads from the runner's pipe per wake-up: a Linux pipe's default
capacity, so one read usually takes all the runner has written. Every complete message
in it is delivered in one batch (a token frame is about 150 bytes). The pipe itself is
bounded by the kernel's buffer: the runner blocks when it is full, so a slow parent slows
generation rather than growing memory. A message larger than this (a big embedding) is
gathered over several wake-ups, never with a blocking read."""

_SIZE = struct.Struct("!i")
_LONG_SIZE = struct.Struct("!Q")
"""`multiprocessing.Connection.send_bytes` framing: a signed 32-bit big-endian length, or
-1 followed by an unsigned 64-bit length for messages of 2 GiB and more."""

CANCEL_RETRY_S = 0.05
"""Retry interval for a Cancel that found the inbox full (it must not be lost)."""

CRASH_ERROR_TYPE = StreamErrorType.RUNNER_CRASHED
SHUTDOWN_ERROR_TYPE = StreamErrorType.RUNNER_SHUTDOWN
UNAVAILABLE_ERROR_TYPE = StreamErrorType.RUNNER_UNAVAILABLE
BUSY_ERROR_TYPE = StreamErrorType.RUNNER_BUSY

ReportCallback = Callable[[FromRunner], None]


@dataclass
class _Tracked:
    """What the parent has seen of one submitted task's stream."""

    task: ApiTask
    accepted: bool = False
    last_seq: int | None = None
    terminal_sent: bool = False


@dataclass(frozen=True)
class SupervisorStats:
    runner_id: str
    instance_id: str
    pid: int | None
    alive: bool
    exitcode: int | None
    status: str
    in_flight: int
    inbox_depth: int | None
    inbox_capacity: int
    reader_batches: int
    largest_reader_batch: int
    crashes: int
    refused_submits: int
    synthesized_terminals: int
    reports_delivered: int
    cancelled_by_runner: int
    """Streams the runner itself ended as cancelled (it heard a cancel and stopped the work)."""
    uptime_s: float | None


def describe_exit(exitcode: int | None) -> str:
    if exitcode is None:
        return "runner exited with an unknown code"
    if exitcode < 0:
        try:
            return f"runner exited with code {exitcode} ({signal.Signals(-exitcode).name})"
        except ValueError:
            pass
    return f"runner exited with code {exitcode}"


class RunnerSupervisor:
    """Spawns and supervises one runner process. All methods run on one event loop."""

    def __init__(
        self,
        *,
        instance: Instance,
        runner_id: RunnerId,
        card: ModelCard,
        model_path: str,
        on_report: ReportCallback,
        draft_model_path: str | None = None,
        projector_path: str | None = None,
        n_threads: int | None = None,
        pool_key: bytes | None = None,
        first_status_deadline_s: float = FIRST_STATUS_DEADLINE_S,
        inbox_capacity: int = INBOX_CAPACITY,
    ) -> None:
        self._load = LoadShard(
            instance=instance, runner_id=runner_id, card=card, model_path=model_path, draft_model_path=draft_model_path,
            projector_path=projector_path, n_threads=n_threads,
            pool_key=pool_key.hex() if pool_key is not None and len(instance.shards) > 1 else None,
        )
        self._on_report = on_report
        self._first_status_deadline_s = first_status_deadline_s
        self._inbox_capacity = inbox_capacity

        self._loop: asyncio.AbstractEventLoop | None = None
        self._process: Any = None
        self._inbox: Any = None
        self._outbox: Any = None  # the parent's (read) end of the runner's outbox pipe
        self._outbox_fd: int | None = None  # its fd while the loop watches it
        self._unread = bytearray()  # bytes read from the pipe that do not make a message yet
        self._batches = 0
        self._largest_batch = 0
        self._gone = threading.Event()  # the process has exited (set by the waiter thread)
        self._exit_handled: asyncio.Event | None = None
        self._deadline: asyncio.TimerHandle | None = None

        self._status = RunnerStatus(state="Idle")
        self._seen_status = False
        self._failure_reported = False
        self._shutdown_requested = False
        self._exitcode: int | None = None
        self._tasks: dict[TaskId, _Tracked] = {}
        self._by_command: dict[CommandId, TaskId] = {}
        self._started_at: float | None = None
        self._counts = {"crashes": 0, "refused": 0, "synthesized": 0, "delivered": 0, "cancelled": 0}

    # -- properties -------------------------------------------------------------------------

    @property
    def runner_id(self) -> RunnerId:
        return self._load.runner_id

    @property
    def instance(self) -> Instance:
        return self._load.instance

    @property
    def status(self) -> RunnerStatus:
        return self._status

    @property
    def in_flight(self) -> int:
        """Tasks submitted whose TaskDone has not been reported yet."""
        return len(self._tasks)

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    @property
    def exited(self) -> bool:
        return self._exit_handled is not None and self._exit_handled.is_set()

    @property
    def exitcode(self) -> int | None:
        return self._exitcode

    # -- lifecycle ----------------------------------------------------------------------------

    async def start(self) -> None:
        """Spawn the runner and send it LoadShard. Returns once the process is started; its
        progress arrives as StatusChanged reports."""
        if self._process is not None:
            raise RuntimeError(f"runner {self.runner_id} was already started")
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._exit_handled = asyncio.Event()
        ctx = mp.get_context("spawn")
        self._inbox = ctx.Queue(maxsize=self._inbox_capacity)
        self._outbox, runner_end = ctx.Pipe(duplex=False)
        self._process = ctx.Process(
            target=runner_main,
            args=(self._inbox, runner_end, os.getpid()),
            name=f"skulk-runner-{self.runner_id}",
            daemon=True,
        )
        try:
            self._process.start()
        except Exception as exc:  # fork/exec refused (limits, memory): a failure to report, not raise
            reason = f"could not start the runner process: {type(exc).__name__}: {exc}"
            log.error("runner %s: %s", self.runner_id, reason)
            self._failure_reported = True
            self._exit_handled.set()
            runner_end.close()
            self._close_queues()
            loop.call_soon(self._emit, StatusChanged(status=RunnerStatus(state="Failed", error_message=reason)))
            return
        # Only the runner may hold the write end: its exit then reads as end-of-file here.
        runner_end.close()
        self._started_at = time.monotonic()
        self._inbox.put_nowait(self._load)
        self._outbox_fd = outbox_fd = self._outbox.fileno()
        os.set_blocking(outbox_fd, False)
        loop.add_reader(outbox_fd, self._on_readable)
        threading.Thread(target=self._wait_process, name=f"runner-{self.runner_id}-waiter", daemon=True).start()
        self._deadline = loop.call_later(self._first_status_deadline_s, self._first_status_expired)
        log.info(
            "runner %s (instance %s) spawned, pid %s", self.runner_id, self.instance.instance_id, self._process.pid
        )

    def submit(self, task: ApiTask) -> None:
        """Hand a generation to the runner. Never blocks; a task that cannot be handed over
        ends at once (on the next loop iteration) with a failed terminal and TaskDone."""
        if task.task_id in self._tasks:
            raise ValueError(f"task {task.task_id} is already in flight on runner {self.runner_id}")
        if self._started_at is None or self._gone.is_set() or self.exited or self._shutdown_requested:
            self._refuse(task, UNAVAILABLE_ERROR_TYPE, f"runner {self.runner_id} is not running")
            return
        tracked = _Tracked(task)
        self._tasks[task.task_id] = tracked
        self._by_command[task.command_id] = task.task_id
        try:
            self._inbox.put_nowait(Generate(task=task))
        except queue.Full:
            self._untrack(task.task_id)
            self._refuse(task, BUSY_ERROR_TYPE, f"runner {self.runner_id} has {self._inbox_capacity} messages queued")

    def cancel(self, task_id: TaskId) -> None:
        """Ask the runner to stop a task. Idempotent; a no-op for unknown or finished tasks."""
        if task_id not in self._tasks or self.exited or self._gone.is_set():
            return
        try:
            self._inbox.put_nowait(Cancel(task_id=task_id))
        except queue.Full:
            assert self._loop is not None
            self._loop.call_later(CANCEL_RETRY_S, self.cancel, task_id)

    async def shutdown(self, timeout_s: float = SHUTDOWN_TIMEOUT_S) -> int | None:
        """Stop the runner: ShutdownRunner, then SIGTERM after `timeout_s`, then SIGKILL after
        TERMINATE_TIMEOUT_S; each wait bounded. Returns the exit code (None if unknown)."""
        if self._process is None:
            return None
        self._shutdown_requested = True
        if not self.exited and not self._gone.is_set():
            try:
                self._inbox.put_nowait(ShutdownRunner())
            except queue.Full:
                timeout_s = 0.0  # cannot ask nicely; go straight to SIGTERM
        if not await self._wait_exit(timeout_s):
            log.warning("runner %s ignored ShutdownRunner for %.1fs; terminating", self.runner_id, timeout_s)
            if not self._gone.is_set():  # never signal a pid that may already be reaped
                self._process.terminate()
            if not await self._wait_exit(TERMINATE_TIMEOUT_S):
                log.warning("runner %s ignored SIGTERM for %.1fs; killing", self.runner_id, TERMINATE_TIMEOUT_S)
                if not self._gone.is_set():
                    self._process.kill()
                if not await self._wait_exit(KILL_TIMEOUT_S + EXIT_DRAIN_TIMEOUT_S):
                    log.error("runner %s (pid %s) did not exit after SIGKILL", self.runner_id, self.pid)
        return self._exitcode

    def stats(self) -> SupervisorStats:
        return SupervisorStats(
            runner_id=self.runner_id,
            instance_id=self.instance.instance_id,
            pid=self.pid,
            alive=self._started_at is not None and not self._gone.is_set(),
            exitcode=self._exitcode,
            status=self._status.state,
            in_flight=self.in_flight,
            inbox_depth=_depth(self._inbox),
            inbox_capacity=self._inbox_capacity,
            reader_batches=self._batches,
            largest_reader_batch=self._largest_batch,
            crashes=self._counts["crashes"],
            refused_submits=self._counts["refused"],
            synthesized_terminals=self._counts["synthesized"],
            reports_delivered=self._counts["delivered"],
            cancelled_by_runner=self._counts["cancelled"],
            uptime_s=None if self._started_at is None else time.monotonic() - self._started_at,
        )

    # -- the waiter thread (never touches supervisor state; it only posts to the loop) -----

    def _wait_process(self) -> None:
        self._process.join()
        self._gone.set()
        assert self._loop is not None
        _post(self._loop, self._on_process_gone)

    # -- loop side ----------------------------------------------------------------------------

    def _on_readable(self) -> None:
        self._read_once()

    def _read_once(self) -> bool:
        """Read what the runner's pipe holds now and deliver every complete message; stop
        reading at its end-of-file. False when there was nothing to read."""
        if self._outbox_fd is None:
            return False
        ended = False
        try:
            data = os.read(self._outbox_fd, READ_CHUNK_BYTES)
        except (BlockingIOError, InterruptedError):
            return False  # woken without data; the next wake-up reads it
        except OSError:
            data = b""  # the pipe broke: nothing more can come from it
        if data:
            self._unread += data
        else:
            ended = True  # the runner closed its end (exited); a partial message is cut short
        batch, broken = self._decode_unread()
        if batch:
            self._batches += 1
            self._largest_batch = max(self._largest_batch, len(batch))
            self._deliver_batch(batch)  # what was read before the end (or a bad message) first
        if ended or broken:
            self._stop_reading()
        return True

    def _decode_unread(self) -> tuple[list[FromRunner], bool]:
        """The complete messages at the front of the unread bytes (removed from them), and
        whether a message could not be decoded (the stream from this runner is broken)."""
        buf = self._unread
        batch: list[FromRunner] = []
        pos, end = 0, len(buf)
        try:
            while end - pos >= _SIZE.size:
                (size,) = _SIZE.unpack_from(buf, pos)
                start = pos + _SIZE.size
                if size == -1:
                    if end - start < _LONG_SIZE.size:
                        break
                    (size,) = _LONG_SIZE.unpack_from(buf, start)
                    start += _LONG_SIZE.size
                if end - start < size:
                    break
                pos = start + size
                batch.append(unpack(buf[start:pos]))
        except Exception:
            log.exception("runner %s: unreadable output; treating the runner as gone", self.runner_id)
            return batch, True
        finally:
            del buf[:pos]
        return batch, False

    def _drain_after_exit(self) -> None:
        """The process is gone, so nothing more will be written: deliver what its pipe holds
        and stop reading, end-of-file or not (a cut message is dropped)."""
        while self._read_once():
            pass
        self._stop_reading()  # nothing left: all it wrote has been read

    def _stop_reading(self) -> None:
        if self._outbox_fd is None:
            return
        assert self._loop is not None
        self._loop.remove_reader(self._outbox_fd)
        self._outbox_fd = None
        self._unread.clear()
        self._outbox.close()

    def _on_process_gone(self) -> None:
        self._drain_after_exit()  # its last status and frames come before the exit's report
        self._handle_exit(self._process.exitcode)

    def _handle_exit(self, exitcode: int | None) -> None:
        assert self._exit_handled is not None
        if self._exit_handled.is_set():
            return
        self._exitcode = exitcode
        if self._deadline is not None:
            self._deadline.cancel()
        # A runner already reported Failed by the supervisor (first-status deadline) died of
        # that failure, even if the worker asked for a shutdown in reaction to the report.
        expected = self._shutdown_requested and not self._failure_reported
        prior_error = self._status.error_message if self._status.state == "Failed" else None
        reason = describe_exit(exitcode)
        if prior_error and self._failure_reported:
            reason = f"{prior_error}; {reason}"  # the supervisor's own verdict came first
        elif prior_error:
            reason = f"{reason}: {prior_error}"  # the runner explained itself, then exited
        if expected:
            log.info("runner %s shut down (%s)", self.runner_id, reason)
        else:
            self._counts["crashes"] += 1
            log.error("runner %s (instance %s) died: %s", self.runner_id, self.instance.instance_id, reason)
        error_type = SHUTDOWN_ERROR_TYPE if expected else CRASH_ERROR_TYPE
        for tracked in list(self._tasks.values()):
            self._fail_tracked(tracked, error_type, f"{reason} while serving this request")
        if expected:
            self._emit(StatusChanged(status=RunnerStatus(state="Shutdown"), in_flight=0))
        elif not self._failure_reported:
            self._failure_reported = True
            self._emit(StatusChanged(status=RunnerStatus(state="Failed", error_message=reason), in_flight=0))
        self._exit_handled.set()
        self._close_queues()

    def _first_status_expired(self) -> None:
        if self._seen_status or self._gone.is_set():
            return
        reason = f"runner sent no status within {self._first_status_deadline_s:g}s of spawn"
        log.error("runner %s (pid %s): %s; killing it", self.runner_id, self.pid, reason)
        self._failure_reported = True
        self._emit(StatusChanged(status=RunnerStatus(state="Failed", error_message=reason), in_flight=self.in_flight))
        self._process.kill()

    def _deliver_batch(self, batch: list[FromRunner]) -> None:
        """Messages from the runner, on the loop, in the runner's order."""
        assert self._exit_handled is not None
        for message in batch:
            if self._exit_handled.is_set():
                return  # the exit was already reported; late output would contradict it
            self._emit(message)

    def _emit(self, message: FromRunner) -> None:
        self._note(message)
        self._counts["delivered"] += 1
        try:
            self._on_report(message)
        except Exception:
            log.exception("runner %s: on_report failed for %s", self.runner_id, type(message).__name__)

    def _note(self, message: FromRunner) -> None:
        """Bookkeeping before a report goes out."""
        if isinstance(message, StatusChanged):
            self._status = message.status
            if not self._seen_status:
                self._seen_status = True
                if self._deadline is not None:
                    self._deadline.cancel()
        elif isinstance(message, TaskAccepted):
            tracked = self._tasks.get(message.task_id)
            if tracked is not None:
                tracked.accepted = True
        elif isinstance(message, Frame):
            task_id = self._by_command.get(message.frame.command_id)
            tracked = self._tasks.get(task_id) if task_id is not None else None
            if tracked is not None:
                frame = message.frame
                if isinstance(frame, (StreamStarted, StreamPayload)):
                    tracked.last_seq = frame.seq
                elif isinstance(frame, StreamTerminal):
                    tracked.last_seq = frame.seq
                    tracked.terminal_sent = True
                    if frame.outcome == "cancelled":
                        self._counts["cancelled"] += 1
        elif isinstance(message, TaskDone):
            self._untrack(message.task_id)

    def _untrack(self, task_id: TaskId) -> None:
        tracked = self._tasks.pop(task_id, None)
        if tracked is not None:
            self._by_command.pop(tracked.task.command_id, None)

    def _fail_tracked(self, tracked: _Tracked, error_type: str, message: str) -> None:
        task = tracked.task
        if not tracked.terminal_sent:
            seq = 0
            if tracked.last_seq is None:
                self._emit(self._frame(task, StreamStarted(command_id=task.command_id, runner_id=self.runner_id)))
            else:
                seq = tracked.last_seq
            self._counts["synthesized"] += 1
            self._emit(
                self._frame(
                    task,
                    StreamTerminal(
                        command_id=task.command_id, seq=seq + 1, outcome="failed",
                        error_type=error_type, error_message=message,
                    ),
                )
            )
        self._emit(TaskDone(task_id=task.task_id, outcome="failed", error_message=message, error_type=error_type))

    def _refuse(self, task: ApiTask, error_type: str, message: str) -> None:
        self._counts["refused"] += 1
        log.warning("runner %s refused task %s: %s", self.runner_id, task.task_id, message)

        def report() -> None:
            self._counts["synthesized"] += 1
            self._emit(self._frame(task, StreamStarted(command_id=task.command_id, runner_id=self.runner_id)))
            self._emit(
                self._frame(
                    task,
                    StreamTerminal(
                        command_id=task.command_id, seq=1, outcome="failed",
                        error_type=error_type, error_message=message,
                    ),
                )
            )
            self._emit(TaskDone(task_id=task.task_id, outcome="failed", error_message=message, error_type=error_type))

        # Never call on_report re-entrantly from inside submit().
        asyncio.get_running_loop().call_soon(report)

    @staticmethod
    def _frame(task: ApiTask, frame: Any) -> Frame:
        return Frame(owner_node_id=task.owner_node_id, frame=frame)

    async def _wait_exit(self, timeout_s: float) -> bool:
        assert self._exit_handled is not None
        try:
            await asyncio.wait_for(self._exit_handled.wait(), max(timeout_s, 0.0))
        except TimeoutError:
            return self._exit_handled.is_set()
        return True

    def _close_queues(self) -> None:
        # The process is gone: anything still buffered for it can never be read. Without
        # cancel_join_thread the parent would hang at its own exit flushing into the pipe.
        try:
            self._inbox.cancel_join_thread()
            self._inbox.close()
        except (OSError, ValueError):
            pass
        # The outbox's read end is closed where reading stops (end-of-file or the exit's drain).


def _post(loop: asyncio.AbstractEventLoop, callback: Callable[..., None], *args: Any) -> bool:
    try:
        loop.call_soon_threadsafe(callback, *args)
        return True
    except RuntimeError:  # the loop is closed: nobody is listening any more
        return False


def _depth(q: Any) -> int | None:
    if q is None:
        return None
    try:
        return q.qsize()
    except (NotImplementedError, OSError, ValueError):  # qsize is unsupported on macOS
        return None


__all__ = [
    "BUSY_ERROR_TYPE",
    "CANCEL_RETRY_S",
    "CRASH_ERROR_TYPE",
    "EXIT_DRAIN_TIMEOUT_S",
    "FIRST_STATUS_DEADLINE_S",
    "INBOX_CAPACITY",
    "KILL_TIMEOUT_S",
    "READ_CHUNK_BYTES",
    "SHUTDOWN_ERROR_TYPE",
    "SHUTDOWN_TIMEOUT_S",
    "TERMINATE_TIMEOUT_S",
    "UNAVAILABLE_ERROR_TYPE",
    "ReportCallback",
    "RunnerSupervisor",
    "SupervisorStats",
    "describe_exit",
]
