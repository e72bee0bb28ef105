"""The relay (API side) and the assembler (serving side) of task-input transfer, wired to each
other through an in-memory network that can lose chunks and acks, on a fake clock: a bound
input leaves in chunks and is acked; a lost chunk is sent again; a transfer lost on every
try, one too large, or one sent to a node without a worker ends the command's stream typed."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from skulk.cluster.task_inputs import TaskInputRelay
from skulk.shared.input_transfer import ACK_DEADLINE_S, CHUNK_BYTES, MAX_SEND_TRIES, TRANSFER_DEADLINE_S
from skulk.shared.types.common import ChatMessage
from skulk.shared.types.ids import CommandId, InstanceId, ModelId, NodeId, RunnerId, TaskId
from skulk.shared.types.instances import Instance, ShardAssignment
from skulk.shared.types.state import State
from skulk.shared.types.task_inputs import TaskInput, TaskInputAck, TaskInputChunk, TransferError
from skulk.shared.types.tasks import TextGeneration, TextGenerationParams
from skulk.worker.task_inputs import InputAssembler

COMMAND = CommandId("c1")
MODEL = ModelId("m")


def bound_state() -> State:
    instance = Instance(instance_id=InstanceId("i1"), model_id=MODEL, sharding="Pipeline", context_token_limit=2048,
                        shards=[ShardAssignment(node_id=NodeId("b"), runner_id=RunnerId("r1"), rank=0, world_size=1,
                                                start_layer=0, end_layer=1, backend="llama_cpp-cpu")])
    params = TextGenerationParams(model_id=MODEL, messages=[ChatMessage(role="user", content="")])
    task = TextGeneration(task_id=TaskId("t1"), instance_id=instance.instance_id, command_id=COMMAND,
                          owner_node_id=NodeId("a"), params=params, status="Pending")
    return State(instances={instance.instance_id: instance}, tasks={task.task_id: task})


def chat(text: str) -> TaskInput:
    return TaskInput(command_id=COMMAND, params=TextGenerationParams(
        model_id=MODEL, messages=[ChatMessage(role="user", content=text)]))


@dataclass
class Net:
    """API node "a" and serving node "b"; `drop_seqs` chunks never arrive, acks can be lost."""

    now: float = 0.0
    drop_seqs: frozenset[int] = frozenset()
    lose_acks: int = 0
    worker: bool = True
    delivered: list[TaskInput] = field(default_factory=list)
    failures: list[tuple[str, TransferError]] = field(default_factory=list)
    chunks_sent: int = 0

    def __post_init__(self) -> None:
        self.relay = TaskInputRelay(send=self.send, fail=lambda c, e, _: self.failures.append((c, e)),
                                    clock=lambda: self.now)
        self.assembler = InputAssembler(deliver=self.delivered.append if self.worker else None, answer=self.answer,
                                        clock=lambda: self.now)

    def send(self, node_id: str, chunks: tuple[TaskInputChunk, ...]) -> None:
        assert node_id == "b"
        for chunk in chunks:
            self.chunks_sent += 1
            if chunk.seq not in self.drop_seqs:
                self.assembler.receive("a", chunk)

    def answer(self, node_id: str, ack: TaskInputAck) -> None:
        assert node_id == "a"
        if self.lose_acks:
            self.lose_acks -= 1
            return
        self.relay.on_ack(ack)

    def tick(self, seconds: float) -> None:
        self.now += seconds
        self.relay.flush(bound_state())
        self.assembler.expire()


LARGE = chat(random.Random(5).randbytes(CHUNK_BYTES * 3 // 4).hex())  # 1.5 MiB of text: 2 chunks


def test_a_bound_input_travels_in_chunks_and_is_acked():
    net = Net()
    net.relay.hold(LARGE)
    net.tick(0)
    assert net.delivered == [LARGE]
    assert net.relay.stats()["acked"] == 1 and net.relay.stats()["awaitingAck"] == 0
    assert net.chunks_sent == net.relay.stats()["chunksSent"] == 2
    assert net.assembler.stats()["completed"] == 1 and net.assembler.stats()["inFlightBytes"] == 0


def test_a_lost_ack_is_answered_again_when_the_transfer_is_resent():
    net = Net(lose_acks=1)
    net.relay.hold(LARGE)
    net.tick(0)
    assert net.relay.stats()["awaitingAck"] == 1
    net.tick(ACK_DEADLINE_S)
    assert net.relay.stats()["acked"] == 1 and net.relay.stats()["resent"] == 1 and net.failures == []
    assert net.delivered == [LARGE, LARGE]  # the same input again: the store keeps one per command


def test_a_chunk_lost_once_is_sent_again_and_completes():
    net = Net(drop_seqs=frozenset({1}))
    net.relay.hold(LARGE)
    net.tick(0)
    assert net.delivered == []
    net.drop_seqs = frozenset()
    net.tick(ACK_DEADLINE_S)
    assert net.delivered == [LARGE] and net.failures == []
    assert net.assembler.stats()["inFlight"] == 1  # the first try's chunk 0, until its deadline
    net.tick(TRANSFER_DEADLINE_S)
    assert net.assembler.stats()["inFlight"] == 0 and net.assembler.stats()["expired"] == 1
    assert net.failures == []  # its refusal names a transfer the relay no longer holds


def test_a_transfer_lost_on_every_try_fails_the_command_typed():
    net = Net(drop_seqs=frozenset({1}))
    net.relay.hold(LARGE)
    net.tick(0)
    for _ in range(MAX_SEND_TRIES):
        net.tick(ACK_DEADLINE_S)
    assert net.failures == [(COMMAND, TransferError.LOST)] and net.delivered == []
    assert net.relay.stats()["awaitingAck"] == 0 and net.relay.stats()["failed"] == 1


def test_a_node_without_a_worker_refuses_the_transfer_for_good():
    net = Net(worker=False)
    net.relay.hold(chat("hello"))
    net.tick(0)
    assert net.failures == [(COMMAND, TransferError.NO_WORKER)]


def test_an_input_discarded_before_its_ack_is_forgotten():
    net = Net(lose_acks=1)
    net.relay.hold(LARGE)
    net.tick(0)
    net.relay.discard(COMMAND)
    assert net.relay.stats()["awaitingAck"] == 0
    net.tick(ACK_DEADLINE_S)
    assert net.failures == [] and net.relay.stats()["resent"] == 0
