"""The worker's shell: carries out `worker.plan` and relays what runners report.

It owns this node's runner supervisors and the tasks it handed to runners; its model
artifacts (resolving, downloading, failures) are `worker.downloads.ArtifactDownloads`, which
it constructs and asks. Every pass asks the pure `plan` for the next action until there is
none. Runner reports become events for the master (status, acknowledgement, completion)
through the event producer, and output frames go to the API node that owns the request:
straight into the local streams when that is this node, otherwise over the node-addressed
DATA topic, in order, through one bounded egress queue.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable, Hashable, Mapping
from pathlib import Path

import psutil

from skulk.artifacts.plan import FailureCooldown
from skulk.cluster.producer import EventProducer
from skulk.cluster.replica import StateReplica
from skulk.model_store.node_store import StoreBinding
from skulk.models.companions import draft_model_path, projector_path
from skulk.observe.traces import TraceStore, WorkerTraces
from skulk.routing.router import Router, RouterError
from skulk.routing.topics import TOPICS
from skulk.shared.serving import runner_serving
from skulk.shared.settings import setting
from skulk.shared.ticks import until_tick_s
from skulk.shared.types.cards import ModelCard
from skulk.shared.types.chunks import DataFrame, StreamTerminal
from skulk.shared.types.commands import ForwarderCommand, RefuseInstancePlacement
from skulk.shared.types.events import RunnerStatusUpdated, TaskAcknowledged, TaskStatusUpdated
from skulk.shared.types.ids import CommandId, EventId, ModelId, NodeId, RunnerId, TaskId, new_id
from skulk.shared.types.instances import RunnerStatus
from skulk.shared.types.task_inputs import TaskInput
from skulk.shared.types.telemetry import InstanceLoad, TelemetryReading
from skulk.shared.wire_keys import to_camel_keys
from skulk.worker import plan as worker_plan
from skulk.worker.downloads import ArtifactDownloads
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
from skulk.worker.task_inputs import TaskInputStore, input_params

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
    forced = setting(TEST_RAM_AVAILABLE_ENV)
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
        self._cards = cards
        self._deliver_local = deliver_local
        self._clock = clock
        self._on_deactivate = on_deactivate
        """Run after an instance's runner stops: the staged-copy recency pass."""
        self._supervisors: dict[RunnerId, RunnerSupervisor] = {}
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
        self._drop_terminals = bool(setting(TEST_DROP_TERMINALS_ENV))
        self._wake = asyncio.Event()
        self._stopping = False
        """Set by `shutdown`: the plan acts no more, so no runner starts while the node stops."""
        self._background: set[asyncio.Task] = set()
        self.downloads = ArtifactDownloads(
            node_id=self.node_id, models_dir=models_dir, cards=cards, state=lambda: replica.state,
            submit=producer.submit, broadcast=lambda reading: router.publish(TOPICS.telemetry, reading),
            spawn=self._spawn_background, wake=self.wake, clock=clock, publish_telemetry=publish_telemetry,
            store=store, store_api_key=store_api_key, disk_reserve_bytes=disk_reserve_bytes,
        )
        """This node's model artifacts: resolved, resolving, failed (`worker.downloads`)."""
        self.frames_local = 0
        self.frames_remote = 0
        self.frames_dropped = 0
        self.refusals_sent = 0
        self.runner_failures = 0

    @property
    def node_id(self) -> NodeId:
        return NodeId(self._router.node_id)

    @property
    def failure_cooldown(self) -> FailureCooldown:
        """How long a passing download failure holds (`downloads.failure_cooldown`)."""
        return self.downloads.failure_cooldown

    @failure_cooldown.setter
    def failure_cooldown(self, cooldown: FailureCooldown) -> None:
        self.downloads.failure_cooldown = cooldown

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
            artifacts=dict(self.downloads.artifacts),
            artifact_failures=self.downloads.failures_now(),
            resolving=frozenset(self.downloads.resolving),
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
            if self._stopping:
                return None
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
            self.downloads.start(action.model_id)
        elif isinstance(action, worker_plan.SpawnRunner):
            await self._spawn_runner(action)
        elif isinstance(action, worker_plan.DispatchTask):
            task = action.task
            params = input_params(task, self.task_inputs.get(task.command_id))
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

    async def _deactivated(self, supervisor: RunnerSupervisor) -> None:
        """After an instance's runner stops on this node: the staged-copy recency pass."""
        try:
            await self._on_deactivate()  # type: ignore[misc]
        except Exception:
            logger.exception("staged-copy pass after deactivating instance %s failed",
                             supervisor.instance.instance_id)

    async def _spawn_runner(self, action: worker_plan.SpawnRunner) -> None:
        runner_id = action.shard.runner_id
        await asyncio.to_thread(self.downloads.mark_staged_use, action.model_path)
        if self._stopping:
            return
        supervisor = RunnerSupervisor(
            instance=action.instance,
            runner_id=runner_id,
            card=action.card,
            model_path=action.model_path,
            draft_model_path=draft_model_path(action.card, self.downloads.companion_artifacts.get(action.card.model_id, {})),
            projector_path=projector_path(action.card, self.downloads.companion_artifacts.get(action.card.model_id, {}),
                                          action.model_path),
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
        self._replica.on_applied(self.downloads.forget_evicted)
        self._replica.on_applied(lambda _event: self.wake())
        self._replica.on_synced(self.wake)  # a snapshot may change State without applying an event
        egress = asyncio.create_task(self._egress_loop(), name="worker-egress")
        loop = asyncio.get_running_loop()
        try:
            while True:
                settled_on = await self._pass() if self._replica.synced else None
                self.task_inputs.expire()
                wait_s = PASS_INTERVAL_S if settled_on is None else pass_wait_s(
                    settled_on, self.downloads.retry_times(), self._clock())
                with contextlib.suppress(TimeoutError):
                    # On the tick grid (`shared.ticks`): the other periodic loops wake with it.
                    # asyncio.timeout, unlike wait_for, starts no helper task per wait.
                    async with asyncio.timeout(until_tick_s(loop.time(), wait_s)):
                        await self._wake.wait()
                self._wake.clear()
        finally:
            egress.cancel()

    async def shutdown(self) -> None:
        """Stop every runner (bounded: each supervisor escalates to SIGKILL) and downloads.
        The plan acts no more from here: while the runners stopped, it used to see their
        shards unserved and start them again (a runner spawned after the node's SIGTERM, then
        killed). A spawn already under way when shutdown began is stopped in the next round."""
        self._stopping = True
        self.downloads.cancel()
        while self._supervisors:
            supervisors, self._supervisors = list(self._supervisors.values()), {}
            await asyncio.gather(*(s.shutdown(timeout_s=2.0) for s in supervisors), return_exceptions=True)

    def instance_loads(self) -> dict[str, InstanceLoad]:
        """Generations running and messages queued, per instance, on this node's runners."""
        loads: dict[str, InstanceLoad] = {}
        for supervisor in list(self._supervisors.values()):
            stats = supervisor.stats()
            load = loads.get(stats.instance_id, InstanceLoad())
            loads[stats.instance_id] = InstanceLoad(in_flight=load.in_flight + stats.in_flight,
                                                    queue_depth=load.queue_depth + (stats.inbox_depth or 0))
        return loads

    def stats(self) -> dict[str, object]:
        return {
            "runners": {rid: to_camel_keys(dataclasses.asdict(sup.stats())) for rid, sup in self._supervisors.items()},
            **self.downloads.stats(),
            "dispatched": len(self._dispatched),
            "taskInputs": self.task_inputs.stats(),
            "givenUp": sorted(self._given_up),
            "egress": {"depth": self._egress.qsize(), "capacity": EGRESS_CAPACITY, "terminalReserve": TERMINAL_RESERVE, "dropped": self.frames_dropped},
            "framesLocal": self.frames_local,
            "framesRemote": self.frames_remote,
            "refusalsSent": self.refusals_sent,
            "runnerFailures": self.runner_failures,
        }


