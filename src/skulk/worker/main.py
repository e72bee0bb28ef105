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
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path

import psutil

from skulk.cluster.producer import EventProducer
from skulk.cluster.replica import StateReplica
from skulk.routing.router import Router, RouterError
from skulk.routing.topics import TOPICS
from skulk.shared.types.cards import ModelCard
from skulk.shared.types.chunks import DataFrame
from skulk.shared.types.events import RunnerStatusUpdated, TaskAcknowledged, TaskStatusUpdated
from skulk.shared.types.ids import new_id
from skulk.shared.types.instances import RunnerStatus
from skulk.shared.wire_keys import to_camel_keys
from skulk.store.tiny_models import ArtifactUnavailable, ensure_local_model
from skulk.worker import plan as worker_plan
from skulk.worker.runner.breaker import CrashBreaker
from skulk.worker.runner.messages import Frame, StatusChanged, TaskAccepted, TaskDone
from skulk.worker.runner.supervisor import RunnerSupervisor

logger = logging.getLogger(__name__)

PASS_INTERVAL_S = 0.25
MAX_ACTIONS_PER_PASS = 64
EGRESS_CAPACITY = 4096
"""Frames waiting to go to remote owning APIs; beyond it a frame is dropped and counted
(the owning API then fails that stream on its lifecycle check, never hangs)."""

_OUTCOME_STATUS = {"completed": "Complete", "failed": "Failed", "cancelled": "Cancelled"}


class Worker:
    def __init__(
        self,
        router: Router,
        replica: StateReplica,
        producer: EventProducer,
        *,
        models_dir: Path,
        cards: Callable[[], Mapping[str, ModelCard]],
        deliver_local: Callable[[DataFrame], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._router = router
        self._replica = replica
        self._producer = producer
        self._models_dir = models_dir
        self._cards = cards
        self._deliver_local = deliver_local
        self._clock = clock
        self._supervisors: dict[str, RunnerSupervisor] = {}
        self._artifacts: dict[str, str] = {}
        self._artifact_failures: dict[str, str] = {}
        self._resolving: set[str] = set()
        self._dispatched: set[str] = set()
        self._task_runner: dict[str, str] = {}
        self._given_up: set[str] = set()
        self._reported_failed: set[str] = set()
        self._submitted_status: dict[str, RunnerStatus] = {}
        self._breaker = CrashBreaker()
        self._egress: asyncio.Queue[tuple[str, DataFrame]] = asyncio.Queue(maxsize=EGRESS_CAPACITY)
        self._wake = asyncio.Event()
        self._background: set[asyncio.Task] = set()
        self.frames_local = 0
        self.frames_remote = 0
        self.frames_dropped = 0

    @property
    def node_id(self) -> str:
        return self._router.node_id

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
        return worker_plan.WorkerView(
            node_id=self.node_id,
            state=self._replica.state,
            cards=self._cards(),
            runners=runners,
            artifacts=dict(self._artifacts),
            artifact_failures=dict(self._artifact_failures),
            resolving=frozenset(self._resolving),
            dispatched=frozenset(self._dispatched),
            given_up=frozenset(self._given_up),
            reported_failed=frozenset(self._reported_failed),
            ram_available_bytes=psutil.virtual_memory().available,
        )

    async def _pass(self) -> None:
        for _ in range(MAX_ACTIONS_PER_PASS):
            action = worker_plan.plan(self._view())
            if action is None:
                return
            await self._act(action)

    async def _act(self, action: worker_plan.WorkerAction) -> None:
        if isinstance(action, worker_plan.StopRunner):
            supervisor = self._supervisors.pop(action.runner_id)
            logger.info("stopping runner %s: %s", action.runner_id, action.reason)
            self._spawn_background(supervisor.shutdown())
            self._breaker = self._breaker.forget(supervisor.instance.instance_id)
        elif isinstance(action, worker_plan.CancelRunnerTask):
            self._supervisors[action.runner_id].cancel(action.task_id)
            self._dispatched.discard(action.task_id)
        elif isinstance(action, worker_plan.ReportRunnerFailed):
            self._reported_failed.add(action.runner_id)
            logger.warning("runner %s cannot start: %s", action.runner_id, action.message)
            self._report_status(action.runner_id, RunnerStatus(state="Failed", error_message=action.message))
        elif isinstance(action, worker_plan.ResolveArtifact):
            self._resolving.add(action.model_id)
            self._spawn_background(self._resolve(action.model_id))
        elif isinstance(action, worker_plan.SpawnRunner):
            await self._spawn_runner(action)
        elif isinstance(action, worker_plan.DispatchTask):
            self._dispatched.add(action.task.task_id)
            self._task_runner[action.task.task_id] = action.runner_id
            self._supervisors[action.runner_id].submit(action.task)

    async def _resolve(self, model_id: str) -> None:
        card = self._cards().get(model_id)
        try:
            if card is None:
                raise ArtifactUnavailable(model_id, "no model card")
            path = await asyncio.to_thread(ensure_local_model, card, self._models_dir)
            self._artifacts[model_id] = str(path)
        except ArtifactUnavailable as exc:
            self._artifact_failures[model_id] = str(exc)
        except Exception as exc:  # noqa: BLE001 - any failure must surface as a reason
            logger.exception("resolving model %s failed", model_id)
            self._artifact_failures[model_id] = f"{type(exc).__name__}: {exc}"
        finally:
            self._resolving.discard(model_id)
            self.wake()

    async def _spawn_runner(self, action: worker_plan.SpawnRunner) -> None:
        runner_id = action.shard.runner_id
        supervisor = RunnerSupervisor(
            instance=action.instance,
            runner_id=runner_id,
            card=action.card,
            model_path=action.model_path,
            on_report=lambda message, rid=runner_id: self._on_report(rid, message),
        )
        self._supervisors[runner_id] = supervisor
        await supervisor.start()

    # -- runner reports ----------------------------------------------------------------------

    def _report_status(self, runner_id: str, status: RunnerStatus) -> None:
        if self._submitted_status.get(runner_id) == status:
            return
        self._submitted_status[runner_id] = status
        self._producer.submit(RunnerStatusUpdated(event_id=new_id(), runner_id=runner_id, status=status))

    def _on_report(self, runner_id: str, message: object) -> None:
        if isinstance(message, Frame):
            self._route_frame(message.owner_node_id, message.frame)
        elif isinstance(message, StatusChanged):
            self._report_status(runner_id, message.status)
            if message.status.state == "Failed":
                self._runner_failed(runner_id, message.status)
        elif isinstance(message, TaskAccepted):
            self._producer.submit(TaskAcknowledged(event_id=new_id(), task_id=message.task_id))
        elif isinstance(message, TaskDone):
            self._dispatched.discard(message.task_id)
            self._task_runner.pop(message.task_id, None)
            self._producer.submit(TaskStatusUpdated(
                event_id=new_id(), task_id=message.task_id, status=_OUTCOME_STATUS[message.outcome],
                error_message=message.error_message,
            ))
        self.wake()

    def _runner_failed(self, runner_id: str, status: RunnerStatus) -> None:
        supervisor = self._supervisors.pop(runner_id, None)
        if supervisor is None:
            return
        instance_id = supervisor.instance.instance_id
        now = self._clock()
        self._breaker = self._breaker.record(instance_id, now)
        if self._breaker.should_give_up(instance_id, now):
            self._given_up.add(runner_id)
            logger.error("runner %s of instance %s keeps failing (%s); giving up", runner_id, instance_id,
                         status.error_message)
        else:
            logger.warning("runner %s failed (%s); it will be restarted", runner_id, status.error_message)
        self._spawn_background(supervisor.shutdown(timeout_s=1.0))

    def _route_frame(self, owner: str, frame: DataFrame) -> None:
        if owner == self.node_id:
            self.frames_local += 1
            self._deliver_local(frame)
            return
        try:
            self._egress.put_nowait((owner, frame))
        except asyncio.QueueFull:
            self.frames_dropped += 1

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
        self._replica.on_applied(lambda _event: self.wake())
        egress = asyncio.create_task(self._egress_loop(), name="worker-egress")
        try:
            while True:
                if self._replica.synced:
                    await self._pass()
                try:
                    await asyncio.wait_for(self._wake.wait(), PASS_INTERVAL_S)
                except TimeoutError:
                    pass
                self._wake.clear()
        finally:
            egress.cancel()

    async def shutdown(self) -> None:
        """Stop every runner (bounded: each supervisor escalates to SIGKILL)."""
        supervisors, self._supervisors = list(self._supervisors.values()), {}
        await asyncio.gather(*(s.shutdown(timeout_s=2.0) for s in supervisors), return_exceptions=True)

    def stats(self) -> dict[str, object]:
        return {
            "runners": {rid: to_camel_keys(dataclasses.asdict(sup.stats())) for rid, sup in self._supervisors.items()},
            "artifacts": dict(self._artifacts),
            "artifactFailures": dict(self._artifact_failures),
            "dispatched": len(self._dispatched),
            "givenUp": sorted(self._given_up),
            "egress": {"depth": self._egress.qsize(), "capacity": EGRESS_CAPACITY, "dropped": self.frames_dropped},
            "framesLocal": self.frames_local,
            "framesRemote": self.frames_remote,
        }
