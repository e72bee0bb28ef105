"""The runner process: the child side of one (instance, rank).

`runner_main` is the `multiprocessing` (spawn) target. It waits for `LoadShard`, loads the
engine chosen by the shard's backend engine from `ENGINES`, warms it up, then serves
`Generate` / `Cancel` through a `Dispatcher` at the engine's width until `ShutdownRunner`,
SIGTERM, or the death of its parent. The message protocol is documented in `messages`.

The engine warms up on the dispatcher's own thread, the thread that will decode: llama.cpp's
OpenMP build keeps one thread team per calling thread, and a second team (warm-up on the main
thread, decoding on another) doubles the threads that wait at every barrier.

This process must never touch cluster state or the event log: it talks only to its parent,
through the inbox queue and the outbox pipe it was given. The only network it touches is its
own group's (an MLX ring, or a llama.cpp pool's authenticated channel, `skulk.pool`): ranks
1..n of a multi-node llama_cpp instance run the pool donor instead of the engine. It must never outlive its parent either (a
watchdog thread exits it when the parent pid goes away).

An idle runner does not wake on a timer: its main thread blocks on the inbox until a message
comes or an idle unload falls due (`residency.idle_check_in_s`), SIGTERM is relayed into the
inbox, and the watchdog waits on the parent's pidfd where the OS has one.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import select
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.queues import Queue as MpQueue
from typing import Any

from skulk.shared.residency import idle_check_in_s, idle_ttl, unload_due
from skulk.shared.settings import setting
from skulk.shared.types.cards import backend_engine
from skulk.shared.types.chunks import ResultChunk, StreamPayload, StreamStarted, StreamTerminal, TokenChunk
from skulk.shared.types.common import RunnerState
from skulk.shared.types.engines import is_pipelined, is_pool_donor, on_vision_path
from skulk.shared.types.ids import CommandId, RunnerId, TaskId
from skulk.shared.types.instances import RunnerStatus
from skulk.shared.types.tasks import ApiTask
from skulk.worker.engines.base import (
    Dispatcher,
    DispatchRejected,
    Engine,
    GeneratedResult,
    GeneratedToken,
    GenerationResult,
    ShardSpec,
)
from skulk.worker.runner.messages import (
    Cancel,
    Frame,
    Generate,
    LoadShard,
    ShutdownRunner,
    StatusChanged,
    TaskAccepted,
    TaskDone,
    TraceSpans,
    pack,
    pack_token,
)
from skulk.worker.runner.spans import RunnerSpans

log = logging.getLogger(__name__)

BUSY_IDLE_CHECK_S = 0.2
"""While a task runs, how often the main loop (else blocked on its inbox) checks whether the
runner went idle, so an idle unload (`residency`) is at most this late after the last task."""

PARENT_WATCH_INTERVAL_S = 1.0
"""How often the watchdog checks that the parent is alive where it cannot wait on the
parent's pidfd (not Linux, or an old kernel); an orphaned runner (holding a whole model's
memory) lives at most this long. Waiting on a pidfd, it exits as soon as the parent does,
and wakes for nothing before (an idle runner polling once a second was 1 of its 6 wake-ups
a second, bench/idle.py)."""

EXIT_OK = 0
EXIT_LOAD_FAILED = 1
EXIT_PARENT_GONE = 3
EXIT_ENGINE_BROKEN = 4
"""The engine raised `EngineBroken`: the runner reported why, then exited (the same code as
`mlx_group.EXIT_GROUP_WEDGED`, the other way a broken group ends its runner)."""


def _llama_cpp_engine() -> Engine:
    from skulk.worker.engines.openmp import apply_wait_policy

    apply_wait_policy(os.environ)  # before llama.cpp (and its OpenMP runtime) loads
    from skulk.worker.engines.llama_cpp.engine import LlamaCppEngine

    return LlamaCppEngine()


def _llama_server_engine() -> Engine:
    from skulk.worker.engines.served.llama_server import LlamaServerEngine

    return LlamaServerEngine()


def _vllm_engine() -> Engine:
    from skulk.worker.engines.served.vllm import VllmEngine

    return VllmEngine()


def _is_pool_donor(shard: Any) -> bool:
    """Ranks 1..n of a multi-node llama.cpp instance lend memory (skulk.pool)."""
    return is_pool_donor(backend_engine(shard.backend), shard.rank)


def _pool_donor_engine() -> Engine:
    from skulk.worker.engines.openmp import apply_wait_policy

    apply_wait_policy(os.environ)  # before llama.cpp (and its OpenMP runtime) loads
    from skulk.worker.engines.llama_cpp.pool import PoolDonorEngine

    return PoolDonorEngine()


def _whisper_engine() -> Engine:
    from skulk.worker.engines.speech.whisper import WhisperEngine

    return WhisperEngine()


def _mlx_whisper_engine() -> Engine:
    from skulk.worker.engines.speech.mlx_whisper_engine import MlxWhisperEngine

    return MlxWhisperEngine()


def _piper_engine() -> Engine:
    from skulk.worker.engines.speech.piper_voice import PiperEngine

    return PiperEngine()


ENGINES: Mapping[str, Callable[[], Engine]] = {
    "llama_cpp": _llama_cpp_engine,
    "llama_server": _llama_server_engine,
    "vllm": _vllm_engine,
    "mlx": lambda: __import__("skulk.worker.engines.mlx.engine", fromlist=["MlxEngine"]).MlxEngine(),  # lazy import
    "faster_whisper": _whisper_engine,
    "mlx_whisper": _mlx_whisper_engine,
    "piper": _piper_engine,
}
"""Engine constructors keyed by the shard's backend engine ('llama_cpp-cuda' -> 'llama_cpp')."""


def _mlx_vision_engine() -> Engine:
    from skulk.worker.engines.mlx.vision import MlxVisionEngine

    return MlxVisionEngine()


VISION_ENGINES: Mapping[str, Callable[[], Engine]] = {
    "mlx": _mlx_vision_engine,
}
"""Constructors for a model on an engine's vision path (`on_vision_path`: a card that sees,
of a family the path runs; MLX: mlx-vlm, `skulk.worker.engines.mlx.vision`)."""


def engine_factory(backend: str, vision: bool) -> Callable[[], Engine] | None:
    """The constructor for a shard on `backend`, on (`vision`) or off the engine's vision path."""
    engine = backend_engine(backend)
    return (VISION_ENGINES.get(engine) if vision else None) or ENGINES.get(engine)


def runner_main(inbox: MpQueue, outbox: Connection, parent_pid: int) -> None:
    """Child entry point. Returns (exit 0) after a clean shutdown; exits non-zero on failure."""
    _configure_logging()
    _start_parent_watchdog(parent_pid)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent's Ctrl-C is the parent's to handle
    _relay_sigterm(inbox, stop)

    load = _await_load(inbox, stop)
    if load is None:
        outbox.close()
        return
    runner = Runner(load, outbox)
    code = runner.start()
    if code == EXIT_OK:
        runner.serve(inbox, stop)
    outbox.close()  # every send was synchronous: nothing is left buffered in this process
    if code != EXIT_OK:
        sys.exit(code)


@dataclass
class _Stream:
    """Per-task output state. `lock` orders every emission of one task's frames, so the
    started frame always precedes tokens even when the dispatcher starts the task at once."""

    task: ApiTask
    lock: threading.Lock = field(default_factory=threading.Lock)
    next_seq: int = 1
    spans: RunnerSpans | None = None
    """Set for a traced task only (`TextGeneration.traced`)."""


class Runner:
    """The serving state of one runner process; also the dispatcher's sink."""

    def __init__(self, load: LoadShard, outbox: Connection) -> None:
        self._load = load
        self._outbox = outbox
        self._send_lock = threading.Lock()
        self._runner_id: RunnerId = load.runner_id
        self._engine: Engine | None = None
        self._dispatcher: Dispatcher | None = None
        self._streams: dict[TaskId, _Stream] = {}
        self._streams_lock = threading.Lock()
        self._status_lock = threading.Lock()
        self._phase: RunnerState = "Loading"
        self._last_status: tuple[RunnerState, int, str | None, bool] | None = None
        self._keep_alive_s: float | None = None
        """The latest request's keep_alive (Ollama), overriding the placement's idleTtl."""
        self._idle_since = time.monotonic()

    # -- lifecycle ------------------------------------------------------------------------

    def start(self) -> int:
        """Load and warm up; returns an exit code (EXIT_OK to go on serving)."""
        self._set_phase("Loading")
        try:
            self._bring_up()
        except Exception as exc:
            log.exception("runner %s failed to load", self._runner_id)
            self._set_phase("Failed", error=f"{type(exc).__name__}: {exc}")
            return EXIT_LOAD_FAILED
        self._set_phase("Ready")
        return EXIT_OK

    def _spec(self) -> ShardSpec:
        return ShardSpec(
            instance=self._load.instance,
            runner_id=self._load.runner_id,
            card=self._load.card,
            model_path=self._load.model_path,
            draft_model_path=self._load.draft_model_path,
            projector_path=self._load.projector_path,
            n_threads=self._load.n_threads,
            pool_key=bytes.fromhex(self._load.pool_key) if self._load.pool_key else None,
        )

    def _bring_up(self, report: bool = True) -> None:
        """Load the engine, start its dispatcher, warm up (phases reported when `report`)."""
        spec = self._spec()
        shard = spec.shard
        vision = on_vision_path(backend_engine(shard.backend), spec.card.family, "vision" in spec.card.capabilities)
        factory = _pool_donor_engine if _is_pool_donor(shard) else engine_factory(shard.backend, vision)
        if factory is None:
            raise ValueError(f"no engine for backend {shard.backend!r} (known: {sorted(ENGINES)})")
        engine = factory()
        set_fatal_handler = getattr(engine, "set_fatal_handler", None)  # an optional engine hook
        if set_fatal_handler is not None:
            set_fatal_handler(self.abort)
        try:
            engine.load(spec)
            self._engine = engine
            if report:
                self._set_phase("Loaded")
                self._set_phase("WarmingUp")
            self._dispatcher = Dispatcher(engine, self, width=engine.concurrency, name=f"runner-{self._runner_id}",
                                          engine_name=backend_engine(shard.backend),
                                          pipelined=is_pipelined(spec.instance.sharding, shard.world_size),
                                          vision=vision)
            self._dispatcher.run_on_worker(engine.warm_up)
        except Exception:
            if self._dispatcher is not None:
                self._dispatcher.close(timeout_s=1.0)
            self._dispatcher = None
            self._engine = None
            engine.close()
            raise

    # -- residency (skulk.shared.residency) -------------------------------------------

    def _idle_check_in_s(self) -> float | None:
        """How long the main loop may block on its inbox (None: until a message comes)."""
        busy = self._dispatcher is not None and self._dispatcher.in_flight > 0
        return idle_check_in_s(idle_ttl(self._load.instance.idle_ttl_s, self._keep_alive_s),
                               self._engine is not None, busy, time.monotonic() - self._idle_since,
                               busy_recheck_s=BUSY_IDLE_CHECK_S)

    def _check_idle(self) -> None:
        """Unload the model once idle past the TTL in force; the runner stays Ready."""
        now = time.monotonic()
        busy = self._dispatcher is not None and self._dispatcher.in_flight > 0
        if busy:
            self._idle_since = now
            return
        ttl = idle_ttl(self._load.instance.idle_ttl_s, self._keep_alive_s)
        if not unload_due(ttl, self._engine is not None, busy, now - self._idle_since):
            return
        log.info("runner %s: idle %.1fs (ttl %.1fs); unloading the model until the next request",
                 self._runner_id, now - self._idle_since, ttl or 0.0)
        dispatcher, engine = self._dispatcher, self._engine
        self._dispatcher, self._engine = None, None
        if dispatcher is not None:
            dispatcher.close()
        if engine is not None:
            engine.close()
        self._report_status()

    def _ensure_loaded(self) -> str | None:
        """Reload an unloaded model before a request (it waits); why not, on failure."""
        if self._engine is not None:
            return None
        started = time.monotonic()
        try:
            self._bring_up(report=False)
        except Exception as exc:
            log.exception("runner %s failed to reload", self._runner_id)
            return f"the model was unloaded while idle and could not be reloaded: {type(exc).__name__}: {exc}"
        log.info("runner %s: model reloaded for a request in %.2fs", self._runner_id, time.monotonic() - started)
        self._report_status()
        return None

    def serve(self, inbox: MpQueue, stop: threading.Event) -> None:
        handlers: dict[type, Callable[[Any], bool]] = {
            Generate: self._on_generate,
            Cancel: self._on_cancel,
            ShutdownRunner: lambda _: False,
            LoadShard: self._on_second_load,
        }
        while not stop.is_set():
            try:
                message = inbox.get(timeout=self._idle_check_in_s())
            except queue.Empty:
                self._check_idle()
                continue
            handler = handlers.get(type(message))
            if handler is None:
                log.error("runner %s: unexpected message %r", self._runner_id, type(message).__name__)
                continue
            if not handler(message):
                break
        self.shutdown()

    def shutdown(self) -> None:
        self._set_phase("ShuttingDown")
        if self._dispatcher is not None and not self._dispatcher.close():
            log.warning("runner %s: generations still running at shutdown", self._runner_id)
        if self._engine is not None:
            self._engine.close()

    def abort(self, error_type: str, message: str) -> None:
        """The engine broke outside any generation's control (a pool lost a donor): end
        every open stream with `error_type` and `message`, report Failed, exit. Never
        returns. Runs on whichever thread noticed (a pool channel's); every frame is
        written synchronously before the exit."""
        with self._streams_lock:
            streams = list(self._streams.values())
            self._streams.clear()
        for stream in streams:
            task = stream.task
            with stream.lock:
                self._frame(task, StreamTerminal(
                    command_id=task.command_id, seq=stream.next_seq, outcome="failed",
                    error_type=error_type, error_message=message,
                ))
                self._send(TaskDone(task_id=task.task_id, outcome="failed", error_message=message,
                                    error_type=error_type))
        log.critical("runner %s: %s; exiting", self._runner_id, message)
        self._set_phase("Failed", error=message)
        os._exit(EXIT_ENGINE_BROKEN)

    # -- inbox handlers (main thread); each returns False to stop serving -------------------

    def _on_generate(self, message: Generate) -> bool:
        task = message.task
        keep_alive = getattr(task.params, "keep_alive_s", None)
        if keep_alive is not None:
            self._keep_alive_s = keep_alive
        self._idle_since = time.monotonic()
        failure = self._ensure_loaded()
        if failure is not None:
            self._refuse(task, "ModelLoadFailed", failure)
            return True
        assert self._dispatcher is not None
        with self._streams_lock:
            if task.task_id in self._streams:
                # Emitting anything would corrupt the live stream of the same command.
                log.error("runner %s: duplicate task %s ignored", self._runner_id, task.task_id)
                return True
            stream = _Stream(task, spans=RunnerSpans() if getattr(task, "traced", False) else None)
            self._streams[task.task_id] = stream
        with stream.lock:
            try:
                self._dispatcher.submit(task.task_id, task.params)
            except DispatchRejected as refusal:
                with self._streams_lock:
                    del self._streams[task.task_id]
                self._refuse(task, refusal.error_type, refusal.message)
                return True
            self._send(TaskAccepted(task_id=task.task_id))
            self._frame(task, StreamStarted(command_id=task.command_id, runner_id=self._runner_id))
        self._report_status()
        return True

    def _on_cancel(self, message: Cancel) -> bool:
        if self._dispatcher is not None:
            self._dispatcher.cancel(message.task_id)
        return True

    def _on_second_load(self, message: LoadShard) -> bool:
        log.error("runner %s: already loaded; LoadShard ignored", self._runner_id)
        return True

    # -- DispatchSink (dispatcher threads) ----------------------------------------------

    def on_start(self, request_id: str) -> None:
        # The started frame went out at admission; a traced task notes its queue wait.
        stream = self._streams.get(TaskId(request_id))
        if stream is not None and stream.spans is not None:
            with stream.lock:
                stream.spans.started()

    def on_token(self, request_id: str, token: GeneratedToken | GeneratedResult) -> None:
        stream = self._streams[TaskId(request_id)]
        task = stream.task
        with stream.lock:
            if stream.spans is not None:
                stream.spans.token()
            if type(token) is GeneratedToken and token.stop_sequence is None and token.prompt_tokens is None:
                # The per-token hot path: no models built.
                self._write(pack_token(
                    task.owner_node_id, task.command_id, stream.next_seq,
                    token.text, token.token_id, token.finish_reason, token.usage,
                ))
            else:
                chunk = _chunk_of(task.command_id, token)
                self._frame(task, StreamPayload(command_id=task.command_id, seq=stream.next_seq, chunk=chunk))
            stream.next_seq += 1

    def on_finish(self, request_id: str, result: GenerationResult) -> None:
        with self._streams_lock:
            stream = self._streams.pop(TaskId(request_id))
        task = stream.task
        with stream.lock:
            if stream.spans is not None:
                self._send(TraceSpans(command_id=task.command_id, spans=stream.spans.finish(result.outcome)))
            self._frame(
                task,
                StreamTerminal(
                    command_id=task.command_id,
                    seq=stream.next_seq,
                    outcome=result.outcome,
                    error_type=result.error_type,
                    error_message=result.error_message,
                ),
            )
            self._send(TaskDone(task_id=task.task_id, outcome=result.outcome, error_message=result.error_message,
                                error_type=result.error_type if result.outcome == "failed" else None))
        self._idle_since = time.monotonic()
        if result.fatal:
            # Every frame above was written synchronously: the client has the reason. Say it
            # once more as this runner's status, then end; a broken engine must not linger.
            log.critical("runner %s: engine broken: %s; exiting", self._runner_id, result.error_message)
            self._set_phase("Failed", error=result.error_message)
            os._exit(EXIT_ENGINE_BROKEN)
        self._report_status()

    # -- output -------------------------------------------------------------------------

    def _refuse(self, task: ApiTask, error_type: str, message: str) -> None:
        log.warning("runner %s refused task %s: %s", self._runner_id, task.task_id, message)
        self._frame(task, StreamStarted(command_id=task.command_id, runner_id=self._runner_id))
        self._frame(
            task,
            StreamTerminal(
                command_id=task.command_id, seq=1, outcome="failed", error_type=error_type, error_message=message
            ),
        )
        self._send(TaskDone(task_id=task.task_id, outcome="failed", error_message=message, error_type=error_type))

    def _frame(self, task: ApiTask, frame: Any) -> None:
        self._send(Frame(owner_node_id=task.owner_node_id, frame=frame))

    def _send(self, message: Any) -> None:
        self._write(pack(message))

    def _write(self, data: bytes) -> None:
        # A blocking write into a pipe the kernel bounds: a slow parent slows generation
        # instead of growing memory. The parent's reader drains continuously.
        try:
            with self._send_lock:
                self._outbox.send_bytes(data)
        except (BrokenPipeError, EOFError, OSError):
            # The parent closed its end: nobody will ever read our output again.
            log.error("runner %s: the parent's pipe is gone; exiting", self._runner_id)
            os._exit(EXIT_PARENT_GONE)

    def _set_phase(self, phase: RunnerState, error: str | None = None) -> None:
        with self._status_lock:
            self._phase = phase
        self._report_status(error)

    def _report_status(self, error: str | None = None) -> None:
        with self._status_lock:
            in_flight = self._dispatcher.in_flight if self._dispatcher is not None else 0
            state: RunnerState = self._phase
            if state == "Ready" and in_flight > 0:
                state = "Running"
            resident = self._engine is not None or state != "Ready"
            current = (state, in_flight, error, resident)
            if current == self._last_status:
                return
            self._last_status = current
            self._send(StatusChanged(status=RunnerStatus(state=state, error_message=error), in_flight=in_flight,
                                     resident=resident))


def _chunk_of(command_id: CommandId, token: GeneratedToken | GeneratedResult) -> TokenChunk | ResultChunk:
    """The chunk for output that is more than plain text: a one-result workload's result,
    or a token that carries extras an engine computed on request (logprobs, reasoning, tool
    calls)."""
    if isinstance(token, GeneratedResult):
        return ResultChunk(command_id=command_id, result=token.result, usage=token.usage)
    extras = {
        name: value
        for name in ("logprob", "top_logprobs", "tool_calls", "reasoning", "stop_sequence", "prompt_tokens",
                     "prompt_logprobs")
        if (value := getattr(token, name, None)) is not None
    }
    return TokenChunk(
        command_id=command_id, text=token.text, token_id=token.token_id,
        finish_reason=token.finish_reason, usage=token.usage, **extras,
    )


def _await_load(inbox: MpQueue, stop: threading.Event) -> LoadShard | None:
    """Block until LoadShard; None when told to stop first."""
    while not stop.is_set():
        message = inbox.get()
        if isinstance(message, LoadShard):
            return message
        if isinstance(message, ShutdownRunner):
            return None
        log.error("runner got %s before LoadShard; ignored", type(message).__name__)
    return None


def _relay_sigterm(inbox: MpQueue, stop: threading.Event) -> None:
    """Make SIGTERM end a runner whose main thread is blocked on its inbox with no timeout.
    Python runs the handler (which sets `stop`) only when the main thread next runs bytecode,
    which a blocked read never does; so the interpreter also writes each caught signal's
    number to a pipe (`signal.set_wakeup_fd`), and a thread reading it sets `stop` and puts a
    ShutdownRunner in the inbox, which the main thread then reads. Main thread only."""
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)

    def relay() -> None:
        while True:
            try:
                caught = os.read(read_fd, 64)
            except OSError:
                return
            if not caught:
                return
            if signal.SIGTERM in caught:
                stop.set()
                with contextlib.suppress(Exception):  # full or closed: the main loop sees `stop` anyway
                    inbox.put(ShutdownRunner(), timeout=1.0)
                return

    threading.Thread(target=relay, name="sigterm-relay", daemon=True).start()


def _parent_pidfd(parent_pid: int) -> int | None:
    """A pidfd of the parent (readable once it exits), or None where there is none (not
    Linux, a kernel before 5.3, a sandbox that forbids it). A pid can be reused once its
    process is gone, so the fd counts only if the parent is still ours after opening it."""
    pidfd_open = getattr(os, "pidfd_open", None)
    if pidfd_open is None:
        return None
    try:
        pidfd = pidfd_open(parent_pid)
    except OSError:
        return None
    if os.getppid() != parent_pid:
        os.close(pidfd)
        return None
    return pidfd


def _start_parent_watchdog(parent_pid: int) -> None:
    def watch() -> None:
        pidfd = _parent_pidfd(parent_pid)
        if pidfd is not None:
            while not select.select([pidfd], [], [])[0]:
                pass
            os._exit(EXIT_PARENT_GONE)
        while True:
            if os.getppid() != parent_pid:
                # Re-parented: the worker is gone and nobody will ever read our output.
                os._exit(EXIT_PARENT_GONE)
            time.sleep(PARENT_WATCH_INTERVAL_S)

    threading.Thread(target=watch, name="parent-watchdog", daemon=True).start()


def _configure_logging() -> None:
    root = logging.getLogger()
    if not root.handlers:
        logging.basicConfig(
            level=setting("SKULK_RUNNER_LOG_LEVEL") or "INFO",
            format=f"%(asctime)s runner[{os.getpid()}] %(levelname)s %(name)s: %(message)s",
            stream=sys.stderr,
        )


__all__ = [
    "BUSY_IDLE_CHECK_S",
    "ENGINES",
    "EXIT_LOAD_FAILED",
    "EXIT_OK",
    "EXIT_PARENT_GONE",
    "PARENT_WATCH_INTERVAL_S",
    "VISION_ENGINES",
    "Runner",
    "engine_factory",
    "runner_main",
]
