"""The worker's shell: carries out `worker.plan` and relays what runners report.

It owns this node's runner supervisors, resolved model artifacts and the tasks it handed
to runners. Every pass asks the pure `plan` for the next action until there is none. Runner
reports become events for the master (status, acknowledgement, completion) through the
event producer, and output frames go to the API node that owns the request: straight into
the local streams when that is this node, otherwise over the node-addressed DATA topic, in
order, through one bounded egress queue.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import threading
import time
from collections.abc import Awaitable, Callable, Hashable, Mapping
from pathlib import Path

import psutil

from skulk.artifacts.plan import (
    ArtifactFailure,
    FailDownload,
    FailureCooldown,
    Route,
    after_staging_failure,
    live_failures,
    route_for,
    staged_dir,
    staging_failure_reason,
)
from skulk.artifacts.resolve import resolve_local_path
from skulk.cluster.producer import EventProducer
from skulk.cluster.replica import StateReplica
from skulk.model_store.eviction import in_use_model_ids
from skulk.model_store.fetch import stage_card
from skulk.model_store.node_store import StoreBinding
from skulk.model_store.staging import StagingFailed, mark_used
from skulk.models.artifact_errors import ArtifactUnavailable
from skulk.models.companions import companion_repo_ids, companions_of, ensure_companions
from skulk.models.downloads import (
    DownloadFailed,
    ProgressCallback,
    ProgressGate,
    download_model,
    gate_progress,
    local_artifact,
    local_size_bytes,
)
from skulk.models.tiny_models import ensure_generated
from skulk.observe.traces import TraceStore, WorkerTraces
from skulk.routing.router import Router, RouterError
from skulk.routing.topics import TOPICS
from skulk.shared.serving import runner_serving
from skulk.shared.ticks import until_tick_s
from skulk.shared.types.cards import ModelCard
from skulk.shared.types.chunks import DataFrame, StreamTerminal
from skulk.shared.types.commands import ForwarderCommand, RefuseInstancePlacement
from skulk.shared.types.events import (
    DownloadCompleted,
    DownloadPending,
    RunnerStatusUpdated,
    TaskAcknowledged,
    TaskStatusUpdated,
)
from skulk.shared.types.events import DownloadFailed as DownloadFailedEvent
from skulk.shared.types.ids import CommandId, DownloadAttemptId, EventId, ModelId, NodeId, RunnerId, TaskId, new_id
from skulk.shared.types.instances import RunnerStatus
from skulk.shared.types.state import DownloadStatusCompleted
from skulk.shared.types.task_inputs import TaskInput
from skulk.shared.types.tasks import TextGeneration
from skulk.shared.types.telemetry import DownloadProgress, TelemetryReading
from skulk.shared.wire_keys import to_camel_keys
from skulk.worker import plan as worker_plan
from skulk.worker.egress import EGRESS_BOUND, EGRESS_CAPACITY, TERMINAL_RESERVE, egress_admits
from skulk.worker.runner.breaker import CrashBreaker
from skulk.worker.runner.messages import Frame, StatusChanged, TaskAccepted, TaskDone, TraceSpans
from skulk.worker.runner.supervisor import RunnerSupervisor
from skulk.worker.shell_rules import (
    PASS_INTERVAL_S,
    pass_wait_s,
    refusal_wait_s,
    refuse_again,
    status_to_report,
    task_status_of,
)
from skulk.worker.staged_copies import eviction_applies
from skulk.worker.task_inputs import TaskInputStore

logger = logging.getLogger(__name__)

MAX_ACTIONS_PER_PASS = 64
TEST_RAM_AVAILABLE_ENV = "SKULK_TEST_WORKER_RAM_AVAILABLE_BYTES"
"""Test-only knob: when set (an integer), the pre-spawn memory guard reads this many bytes
as live free memory instead of psutil's figure. Telemetry (what the master admits on) is
unaffected, so a test can make one real node refuse a shard the master placed on it and
watch the repair chain. Never set it in production."""

TEST_DROP_TERMINALS_ENV = "SKULK_TEST_WORKER_DROPS_TERMINALS"
"""Test-only knob: when set (non-empty), the worker drops every terminal frame bound for a
remote owning API, as a full send queue or a lost publish would. A real-process test shows
the owning API still ends the stream (typed `terminal_lost`) once State shows the task
Complete. Never set it in production."""


def live_ram_available_bytes() -> int:
    """Free memory for the pre-spawn guard: psutil's reading, or the test knob."""
    forced = os.environ.get(TEST_RAM_AVAILABLE_ENV)
    return int(forced) if forced else psutil.virtual_memory().available


class Worker:
    def __init__(
        self,
        router: Router,
        replica: StateReplica,
        producer: EventProducer,
        *,
        models_dir: Path,
        cards: Callable[[], Mapping[ModelId, ModelCard]],
        deliver_local: Callable[[DataFrame], None],
        clock: Callable[[], float] = time.monotonic,
        publish_telemetry: Callable[[Hashable, TelemetryReading], None] | None = None,
        store: Callable[[], StoreBinding | None] | None = None,
        store_api_key: str | None = None,
        on_deactivate: Callable[[], Awaitable[object]] | None = None,
        disk_reserve_bytes: int | None = None,
        traces: TraceStore | None = None,
        pool_key: bytes | None = None,
    ) -> None:
        self._router = router
        self._pool_key = pool_key
        """The cluster's llama.cpp pool channel secret, handed to a pooled instance's runners."""
        self._traces = WorkerTraces(traces) if traces is not None else None
        """Spans of traced tasks on this node (None: the node keeps no traces)."""
        self._replica = replica
        self._producer = producer
        self._models_dir = models_dir
        self._cards = cards
        self._deliver_local = deliver_local
        self._clock = clock
        self._publish_telemetry = publish_telemetry
        self._store = store
        """The model store binding as it is now (it follows the master): Hugging Face cards
        resolve through it; None (or a None binding) downloads straight into `models_dir`."""
        self._store_api_key = store_api_key
        self._on_deactivate = on_deactivate
        """Run after an instance's runner stops: the staged-copy recency pass."""
        self._disk_reserve_bytes = disk_reserve_bytes
        """Free space a direct hub download must leave on the models volume (skulk.yaml's
        disk_reserve_gb); None: the downloader's default (SKULK_DISK_RESERVE_GB, else 10 GiB)."""
        self._fallback_logged: set[str] = set()
        self._download_cancel = threading.Event()
        """Set at shutdown: a download thread stops at its next chunk instead of holding the
        process (the interpreter waits for executor threads) until the transfer ends."""
        self._supervisors: dict[RunnerId, RunnerSupervisor] = {}
        self._artifacts: dict[ModelId, str] = {}
        self._companion_artifacts: dict[str, dict[str, str]] = {}
        """Model id -> its resolved companion repos' paths (repo id -> path), for the engines
        that load them (a drafter, split vision weights) and for diagnostics."""
        self._artifact_failures: dict[str, ArtifactFailure] = {}
        """Models whose files this node could not get, why, and until when (a passing
        failure is forgotten at its `retry_at`: `artifacts.plan.FailureCooldown`)."""
        self.failure_cooldown = FailureCooldown()
        self._resolving: set[ModelId] = set()
        self._dispatched: set[TaskId] = set()
        self._done_unconfirmed: frozenset[TaskId] = frozenset()
        """Tasks whose runner sent TaskDone before State shows them terminal (see
        `worker_plan.still_unconfirmed`)."""
        self._task_runner: dict[TaskId, RunnerId] = {}
        self._task_command: dict[TaskId, CommandId] = {}
        """Dispatched task -> its command, to forget the command's input when the task ends."""
        self.task_inputs = TaskInputStore()
        """The full params of the commands this node runs (their text never enters State)."""
        self._given_up: set[RunnerId] = set()
        self._was_serving: set[RunnerId] = set()
        """Runners that have reported Ready or Running (a multi-rank one is not restarted)."""
        self._reported_failed: set[RunnerId] = set()
        self._submitted_status: dict[RunnerId, RunnerStatus] = {}
        self._breaker = CrashBreaker()
        self._egress: asyncio.Queue[tuple[str, DataFrame]] = asyncio.Queue(maxsize=EGRESS_BOUND)
        self._drop_terminals = bool(os.environ.get(TEST_DROP_TERMINALS_ENV))
        self._wake = asyncio.Event()
        self._background: set[asyncio.Task] = set()
        self.frames_local = 0
        self.frames_remote = 0
        self.frames_dropped = 0
        self.refusals_sent = 0
        self.runner_failures = 0

    @property
    def node_id(self) -> NodeId:
        return NodeId(self._router.node_id)

    def wake(self) -> None:
        self._wake.set()

    # -- the planning loop -------------------------------------------------------------------

    def _view(self) -> worker_plan.WorkerView:
        runners = {
            runner_id: worker_plan.LocalRunner(
                runner_id=runner_id,
                instance_id=sup.instance.instance_id,
                status=sup.status,
                in_flight=frozenset(t for t in self._dispatched if self._task_runner.get(t) == runner_id),
            )
            for runner_id, sup in self._supervisors.items()
        }
        self._done_unconfirmed = worker_plan.still_unconfirmed(self._done_unconfirmed, self._replica.state)
        return worker_plan.WorkerView(
            node_id=self.node_id,
            state=self._replica.state,
            cards=self._cards(),
            runners=runners,
            artifacts=dict(self._artifacts),
            artifact_failures=self._failures_now(),
            resolving=frozenset(self._resolving),
            dispatched=frozenset(self._dispatched) | self._done_unconfirmed,
            given_up=frozenset(self._given_up),
            reported_failed=frozenset(self._reported_failed),
            ram_available_bytes=live_ram_available_bytes(),
            task_inputs=self.task_inputs.ready(),
        )

    async def _pass(self) -> worker_plan.WorkerView | None:
        """Act until the plan has nothing to do; the view it settled on, or None when the
        pass stopped at MAX_ACTIONS_PER_PASS with more to do."""
        for _ in range(MAX_ACTIONS_PER_PASS):
            view = self._view()
            action = worker_plan.plan(view)
            if action is None:
                return view
            await self._act(action)
        return None

    async def _act(self, action: worker_plan.WorkerAction) -> None:
        if isinstance(action, worker_plan.StopRunner):
            supervisor = self._supervisors.pop(action.runner_id)
            logger.info("stopping runner %s: %s", action.runner_id, action.reason)
            self._spawn_background(supervisor.shutdown())
            self._breaker = self._breaker.forget(supervisor.instance.instance_id)
            if self._on_deactivate is not None:
                self._spawn_background(self._deactivated(supervisor))
        elif isinstance(action, worker_plan.CancelRunnerTask):
            self._supervisors[action.runner_id].cancel(action.task_id)
            self._dispatched.discard(action.task_id)
            self._forget_input(action.task_id)
        elif isinstance(action, worker_plan.ReportRunnerFailed):
            self._reported_failed.add(action.runner_id)
            logger.warning("runner %s cannot start: %s", action.runner_id, action.message)
            self._report_status(action.runner_id, RunnerStatus(state="Failed", error_message=action.message))
        elif isinstance(action, worker_plan.RefusePlacement):
            self._reported_failed.add(action.runner_id)
            logger.warning("refusing shard %s of instance %s: %s", action.runner_id, action.instance_id, action.message)
            self._report_status(action.runner_id, RunnerStatus(state="Failed", error_message=action.message))
            self._spawn_background(self._send_refusal(action))
        elif isinstance(action, worker_plan.ResolveArtifact):
            self._resolving.add(action.model_id)
            self._spawn_background(self._resolve(action.model_id))
        elif isinstance(action, worker_plan.SpawnRunner):
            await self._spawn_runner(action)
        elif isinstance(action, worker_plan.DispatchTask):
            task = action.task
            task_input = self.task_inputs.get(task.command_id)
            params = None if task_input is None else (
                task_input.generation if isinstance(task, TextGeneration) else task_input.embedding)
            if params is None:
                logger.warning("task %s: its input is not of its kind; waiting for a proper one", task.task_id)
                self.task_inputs.forget(task.command_id)
                return
            self._dispatched.add(task.task_id)
            self._task_runner[task.task_id] = action.runner_id
            self._task_command[task.task_id] = task.command_id
            if self._traces is not None:
                self._traces.dispatched(task, action.runner_id)
            # State holds the redacted params; the runner gets the request's own.
            self._supervisors[action.runner_id].submit(task.model_copy(update={"params": params}))

    def accept_input(self, item: TaskInput) -> None:
        """A command's full params arrived (data plane, or from this node's own API)."""
        self.task_inputs.accept(item)
        self.wake()

    def _forget_input(self, task_id: TaskId) -> None:
        command_id = self._task_command.pop(task_id, None)
        if command_id is not None:
            self.task_inputs.forget(command_id)

    async def _send_refusal(self, action: worker_plan.RefusePlacement) -> None:
        """Ask the master to re-place the instance. A command that cannot be published, or
        that the master never acted on (published while no master listened), is sent again:
        the runner is un-marked so the next pass refuses anew, for as long as the instance
        exists. The master ignores a refusal of an instance it already repaired."""
        command = RefuseInstancePlacement(
            command_id=CommandId(new_id()), instance_id=action.instance_id, node_id=self.node_id,
            needed_bytes=action.needed_bytes, available_bytes=action.available_bytes, message=action.message,
        )
        try:
            await self._router.publish(TOPICS.commands, ForwarderCommand(origin=self.node_id, command=command))
            self.refusals_sent += 1
            published = True
        except RouterError as exc:
            logger.warning("refusal of instance %s could not reach the master (%s); will retry", action.instance_id, exc)
            published = False
        await asyncio.sleep(refusal_wait_s(published))
        if refuse_again(action.instance_id, self._replica.state.instances):
            self._reported_failed.discard(action.runner_id)
            self.wake()

    async def _resolve(self, model_id: ModelId) -> None:
        card = self._cards().get(model_id)
        try:
            if card is None:
                raise ArtifactUnavailable(model_id, "no model card")
            binding = self._store() if self._store is not None else None
            route = route_for(card, store_bound=binding is not None)
            if route is Route.GENERATE:
                path = await asyncio.to_thread(ensure_generated, card, self._models_dir)
            elif route is Route.LOCAL_PATH:
                path = await asyncio.to_thread(resolve_local_path, card)
            else:
                path = await self._download(card, binding)
            self._artifacts[model_id] = str(path)
        except ArtifactUnavailable as exc:
            # A passing failure (network, hub outage, shutdown) is forgotten at its retry
            # time, so the next placement on this node downloads again instead of failing at
            # once on a stale reason. The runner that failed stays failed; the master's
            # recovery re-places its instance.
            kind = exc.kind if isinstance(exc, DownloadFailed) else None
            self._artifact_failures[model_id] = ArtifactFailure(
                str(exc), self.failure_cooldown.retry_at(kind, self._clock()))
        except Exception as exc:
            logger.exception("resolving model %s failed", model_id)
            self._artifact_failures[model_id] = ArtifactFailure(f"{type(exc).__name__}: {exc}")
        finally:
            self._resolving.discard(model_id)
            self.wake()

    def _failures_now(self) -> dict[ModelId, str]:
        """The artifact failures that still hold (expired ones are dropped for good)."""
        self._artifact_failures = live_failures(self._artifact_failures, self._clock())
        return {ModelId(model_id): failure.reason for model_id, failure in self._artifact_failures.items()}

    async def _download(self, card: ModelCard, binding: StoreBinding | None) -> Path:
        """Obtain a hub card's artifact, telling the cluster: DownloadPending, throttled
        DownloadProgress telemetry, then DownloadCompleted or DownloadFailed (with the reason)
        under one attempt id. A copy already on disk is reported completed once, unless State
        already says so. Failures are re-raised for the runner-failure path.

        With a model store it is staged through the store (`store_fetch.stage_card`); a store
        this node cannot reach at all falls back to a direct hub download. Without one, the
        artifact downloads straight into the models dir.

        The card's companion repos (`companions.companion_download_specs`) resolve through the
        same path, on the fresh and the already-on-disk path alike, before the model is
        reported completed: a required one's failure fails the download, naming it."""
        if binding is None:
            def direct(companion: ModelCard) -> Path:
                return self._download_direct(companion, None)[0]  # a copy on disk is reused as is

            return await self._with_download_events(
                card, self._models_dir, lambda: local_artifact(card, self._models_dir),
                lambda on_progress: self._download_direct(card, on_progress),
                lambda: self._ensure_companions(card, direct))
        root = binding.store.staging_root

        def staged_locally(which: ModelCard) -> Path | None:
            found = local_artifact(which, root)
            staged = staged_dir(found, root) if found is not None else None
            if staged is not None:
                mark_used(staged)
            return found

        # Read on the loop, not in the thread. This transaction's base and companions count as
        # in use too: staging one of them must never evict another.
        in_use = (in_use_model_ids(self._replica.state, self.node_id, companions_of(self._cards))
                  | {card.model_id} | companion_repo_ids(card))

        def staged(companion: ModelCard) -> Path:
            found = staged_locally(companion)
            return found if found is not None else self._stage(binding, companion, in_use, None)[0]

        return await self._with_download_events(
            card, root, lambda: staged_locally(card),
            lambda on_progress: self._stage(binding, card, in_use, on_progress),
            lambda: self._ensure_companions(card, staged))

    def _ensure_companions(self, card: ModelCard, resolve: Callable[[ModelCard], Path]) -> None:
        """Companions through `resolve` (a worker thread); what resolved is kept per model."""
        resolved = ensure_companions(card, resolve)
        self._companion_artifacts[card.model_id] = {repo: str(path) for repo, path in resolved.items()}

    def _download_direct(self, card: ModelCard, on_progress: ProgressCallback | None) -> tuple[Path, int | None]:
        path = download_model(card, self._models_dir, on_progress=on_progress, cancel=self._download_cancel,
                              reserve_bytes=self._disk_reserve_bytes)
        return path, local_size_bytes(card, self._models_dir)

    def _stage(self, binding: StoreBinding, card: ModelCard, in_use: frozenset[str],
               on_progress: ProgressCallback | None) -> tuple[Path, int | None]:
        """Through the store (runs in a worker thread): the copy's path and its size."""
        try:
            path = stage_card(binding, card, in_use_model_ids=in_use, api_key=self._store_api_key,
                              on_progress=on_progress, cancel=self._download_cancel)
        except StagingFailed as exc:
            decision = after_staging_failure(exc.kind)
            if isinstance(decision, FailDownload):
                raise DownloadFailed(exc.model_id, staging_failure_reason(exc.reason), decision.kind) from exc
            if card.model_id not in self._fallback_logged:
                self._fallback_logged.add(card.model_id)
                logger.error(
                    "MODEL STORE UNREACHABLE: the store at %s (%s) did not answer this node (%s); downloading %s "
                    "directly from Hugging Face instead. Expected for a remote member with no route to the home "
                    "store; otherwise fix the route to the store host.",
                    binding.choice.address.base_url, binding.choice.source, exc.reason, card.model_id,
                )
            return self._download_direct(card, on_progress)
        return path, local_size_bytes(card, binding.store.staging_root)

    async def _with_download_events(
        self,
        card: ModelCard,
        root: Path,
        local: Callable[[], Path | None],
        fetch: Callable[[ProgressCallback], tuple[Path, int | None]],
        companions: Callable[[], object] = lambda: None,
    ) -> Path:
        """`companions` runs (in a thread) after the model itself resolved, on both paths, and
        before DownloadCompleted: a model is never reported ready without its required
        companions."""
        node_id, model_id = NodeId(self.node_id), ModelId(card.model_id)
        attempt_id = DownloadAttemptId(new_id())

        def failed(exc: Exception) -> None:
            reason = exc.reason if isinstance(exc, ArtifactUnavailable) else f"{type(exc).__name__}: {exc}"
            logger.warning("download of %s failed: %s", model_id, reason)
            self._producer.submit(DownloadFailedEvent(event_id=EventId(new_id()), node_id=node_id, model_id=model_id,
                                                      attempt_id=attempt_id, error_message=reason))

        found = await asyncio.to_thread(local)
        if found is not None:
            try:
                await asyncio.to_thread(companions)
            except Exception as exc:
                failed(exc)
                raise
            known = self._replica.state.downloads.get(node_id, {}).get(model_id)
            if not isinstance(known, DownloadStatusCompleted):
                size = await asyncio.to_thread(local_size_bytes, card, root)
                self._producer.submit(DownloadCompleted(
                    event_id=EventId(new_id()), node_id=node_id, model_id=model_id, attempt_id=attempt_id,
                    total_bytes=size if size is not None else card.storage_size_bytes,
                ))
            return found
        self._producer.submit(DownloadPending(event_id=EventId(new_id()), node_id=node_id, model_id=model_id,
                                              attempt_id=attempt_id))
        loop = asyncio.get_running_loop()
        gate = ProgressGate()
        seen_total = 0

        def on_progress(done: int, total: int) -> None:  # the download thread
            nonlocal gate, seen_total
            seen_total = total
            gate, due = gate_progress(gate, time.monotonic(), done, total)
            if due:
                reading = DownloadProgress(node_id=node_id, model_id=model_id, attempt_id=attempt_id,
                                           downloaded_bytes=done, total_bytes=total)
                with contextlib.suppress(RuntimeError):  # the loop closed under a shutdown
                    loop.call_soon_threadsafe(self._publish_progress, reading)

        def fetch_all(progress: ProgressCallback) -> tuple[Path, int | None]:
            result = fetch(progress)
            companions()
            return result

        try:
            path, size = await asyncio.to_thread(fetch_all, on_progress)
        except Exception as exc:
            failed(exc)
            raise
        self._producer.submit(DownloadCompleted(event_id=EventId(new_id()), node_id=node_id, model_id=model_id,
                                                attempt_id=attempt_id,
                                                total_bytes=size if size is not None else seen_total))
        return path

    def _publish_progress(self, reading: DownloadProgress) -> None:
        """Download progress is telemetry, never an event: the master skips DownloadOngoing at
        its source and the producer would hold and resend every sample until a later event
        confirmed it. Through the node's telemetry outbox when wired, else straight onto the
        telemetry topic (latest-value: a lost sample is superseded by the next)."""
        key = ("download", reading.model_id)
        if self._publish_telemetry is not None:
            self._publish_telemetry(key, reading)
            return

        async def send() -> None:
            try:
                await self._router.publish(TOPICS.telemetry, reading)
            except RouterError as exc:
                logger.debug("download progress not published: %s", exc)

        self._spawn_background(send())

    async def _deactivated(self, supervisor: RunnerSupervisor) -> None:
        """After an instance's runner stops on this node: the staged-copy recency pass."""
        try:
            await self._on_deactivate()  # type: ignore[misc]
        except Exception:
            logger.exception("staged-copy pass after deactivating instance %s failed",
                             supervisor.instance.instance_id)

    def _mark_staged_use(self, model_path: str) -> None:
        """A runner loads a staged copy: record the use (the recency pass's clock)."""
        binding = self._store() if self._store is not None else None
        if binding is None:
            return
        staged = staged_dir(Path(model_path), binding.store.staging_root)
        if staged is not None:
            with contextlib.suppress(OSError):
                mark_used(staged)

    def _forget_evicted(self, indexed: object) -> None:
        """A StagedModelEvicted for this node: its staged copy is (about to be) gone unless a
        live runner uses it, so the resolved path is forgotten and the next placement
        resolves the model again."""
        model_id = eviction_applies(getattr(indexed, "event", None), self.node_id)
        if model_id is None or model_id in in_use_model_ids(self._replica.state, self.node_id,
                                                            companions_of(self._cards)):
            return
        binding = self._store() if self._store is not None else None
        path = self._artifacts.get(model_id)
        if path is not None and (binding is None or staged_dir(Path(path), binding.store.staging_root) is not None):
            del self._artifacts[model_id]

    async def _spawn_runner(self, action: worker_plan.SpawnRunner) -> None:
        runner_id = action.shard.runner_id
        await asyncio.to_thread(self._mark_staged_use, action.model_path)
        supervisor = RunnerSupervisor(
            instance=action.instance,
            runner_id=runner_id,
            card=action.card,
            model_path=action.model_path,
            on_report=lambda message, rid=runner_id: self._on_report(rid, message),
            pool_key=self._pool_key,
        )
        self._supervisors[runner_id] = supervisor
        await supervisor.start()

    # -- runner reports ----------------------------------------------------------------------

    def _report_status(self, runner_id: RunnerId, status: RunnerStatus) -> None:
        if self._submitted_status.get(runner_id) == status:
            return
        self._submitted_status[runner_id] = status
        if runner_serving(status):
            self._was_serving.add(runner_id)
        self._producer.submit(RunnerStatusUpdated(event_id=EventId(new_id()), runner_id=runner_id, status=status))

    def _on_report(self, runner_id: RunnerId, message: object) -> None:
        if isinstance(message, Frame):
            # Output only: nothing the plan reads changed, so no planning pass per token.
            if self._traces is not None and self._traces.active:
                self._traces.frame(message.frame.command_id, message.owner_node_id,
                                   message.owner_node_id == self.node_id, isinstance(message.frame, StreamTerminal))
            self._route_frame(message.owner_node_id, message.frame)
            return
        if isinstance(message, TraceSpans):
            if self._traces is not None:
                self._traces.runner_spans(message.command_id, message.spans)
            return
        if isinstance(message, StatusChanged):
            status = status_to_report(message.status, runner_id in self._was_serving)
            self._report_status(runner_id, status)
            if status.state == "Failed":
                self._runner_failed(runner_id, status)
        elif isinstance(message, TaskAccepted):
            self._producer.submit(TaskAcknowledged(event_id=EventId(new_id()), task_id=message.task_id))
        elif isinstance(message, TaskDone):
            if self._traces is not None:
                self._traces.done(message.task_id)
            self._dispatched.discard(message.task_id)
            self._done_unconfirmed |= {message.task_id}
            self._task_runner.pop(message.task_id, None)
            self._forget_input(message.task_id)
            self._producer.submit(TaskStatusUpdated(
                event_id=EventId(new_id()), task_id=message.task_id, status=task_status_of(message.outcome),
                error_message=message.error_message, error_type=message.error_type,
            ))
        self.wake()

    def _runner_failed(self, runner_id: RunnerId, status: RunnerStatus) -> None:
        supervisor = self._supervisors.pop(runner_id, None)
        if supervisor is None:
            return
        instance_id = supervisor.instance.instance_id
        self.runner_failures += 1
        now = self._clock()
        self._breaker = self._breaker.record(instance_id, now)
        verdict = worker_plan.after_runner_failure(len(supervisor.instance.shards), bool(status.served),
                                                   self._breaker.should_give_up(instance_id, now))
        if isinstance(verdict, worker_plan.GiveUpRunner):
            self._given_up.add(runner_id)
            self._report_status(runner_id, worker_plan.given_up_status(status, verdict))
            logger.error("runner %s of instance %s %s (%s); not restarting it", runner_id, instance_id,
                         verdict.reason, status.error_message)
        else:
            logger.warning("runner %s failed (%s); it will be restarted", runner_id, status.error_message)
        self._spawn_background(supervisor.shutdown(timeout_s=1.0))

    def _route_frame(self, owner: str, frame: DataFrame) -> None:
        if owner == self.node_id:
            self.frames_local += 1
            self._deliver_local(frame)
            return
        if not egress_admits(frame, self._egress.qsize()):
            self.frames_dropped += 1
            return
        if self._drop_terminals and isinstance(frame, StreamTerminal):
            self.frames_dropped += 1
            logger.warning("test knob %s: dropped the terminal of %s", TEST_DROP_TERMINALS_ENV, frame.command_id)
            return
        self._egress.put_nowait((owner, frame))

    async def _egress_loop(self) -> None:
        while True:
            owner, frame = await self._egress.get()
            try:
                await self._router.publish(TOPICS.data, frame, to_node=owner)
                self.frames_remote += 1
            except RouterError as exc:
                self.frames_dropped += 1
                logger.warning("output frame to %s lost: %s", owner, exc)

    # -- lifecycle ---------------------------------------------------------------------------

    def _spawn_background(self, coro: Awaitable) -> None:
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def run(self) -> None:
        self._replica.on_applied(self._forget_evicted)
        self._replica.on_applied(lambda _event: self.wake())
        self._replica.on_synced(self.wake)  # a snapshot may change State without applying an event
        egress = asyncio.create_task(self._egress_loop(), name="worker-egress")
        loop = asyncio.get_running_loop()
        try:
            while True:
                settled_on = await self._pass() if self._replica.synced else None
                self.task_inputs.expire()
                wait_s = PASS_INTERVAL_S if settled_on is None else pass_wait_s(
                    settled_on, (failure.retry_at for failure in self._artifact_failures.values()), self._clock())
                with contextlib.suppress(TimeoutError):
                    # On the tick grid (`shared.ticks`): the other periodic loops wake with it.
                    # asyncio.timeout, unlike wait_for, starts no helper task per wait.
                    async with asyncio.timeout(until_tick_s(loop.time(), wait_s)):
                        await self._wake.wait()
                self._wake.clear()
        finally:
            egress.cancel()

    async def shutdown(self) -> None:
        """Stop every runner (bounded: each supervisor escalates to SIGKILL) and downloads."""
        self._download_cancel.set()
        supervisors, self._supervisors = list(self._supervisors.values()), {}
        await asyncio.gather(*(s.shutdown(timeout_s=2.0) for s in supervisors), return_exceptions=True)

    def stats(self) -> dict[str, object]:
        return {
            "runners": {rid: to_camel_keys(dataclasses.asdict(sup.stats())) for rid, sup in self._supervisors.items()},
            "artifacts": dict(self._artifacts),
            "companionArtifacts": {m: dict(c) for m, c in self._companion_artifacts.items()},
            "artifactFailures": self._failures_now(),
            "dispatched": len(self._dispatched),
            "taskInputs": self.task_inputs.stats(),
            "givenUp": sorted(self._given_up),
            "egress": {"depth": self._egress.qsize(), "capacity": EGRESS_CAPACITY, "terminalReserve": TERMINAL_RESERVE, "dropped": self.frames_dropped},
            "framesLocal": self.frames_local,
            "framesRemote": self.frames_remote,
            "refusalsSent": self.refusals_sent,
            "runnerFailures": self.runner_failures,
        }


