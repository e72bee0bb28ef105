"""Chaos: a seeded fault schedule against 3 real nodes on loopback while streaming clients run.

Faults are drawn (seeded, `SKULK_CHAOS_SEED`, default 4: each kind once) from: kill -9 of the serving node,
SIGSTOP then SIGCONT of it, kill -9 of the master, kill -9 of the serving runner. A killed
node is restarted on its data dir, as an operator's supervisor would. A runner killed a third
time on one instance trips the worker's crash breaker: the master then re-places the instance
on another node by itself (or, when nothing admits it, the model is refused typed,
`model_not_serving`, and the test re-places it as an operator would). Two client threads
stream short chats through the entry node (never a victim) the whole time. After each fault
the cluster must recover: three members agreeing, the model serving again. The run ends by
checking and printing the invariants:

- every request ended: completed, or a typed error (an error event or JSON body with a type
  and a message); none hung, none ended untyped;
- no index reused: every node's `lastEventIdx` never went backwards while it lived;
- every node agrees on `stateHash`;
- the model serves again.

For each untyped outcome the failure names the step and fault current when the request
started and when it was given up, the elapsed time, and the entry node's open streams with
their tasks as /state shows them (the hung command); the step timings and outcomes per step
come with it, in the assertion message itself (CI shows little more).

Not covered here (each has its own test): network cuts between namespaces
(tests/chaos/test_chaos_netcut.py, tests/cluster/test_network_cut.py), a full disk
(tests/test_full_disk.py). Bounded: `SKULK_CHAOS_FAULTS` faults (default 4), each recovery
within RECOVERY_DEADLINE_S; about 2.5 minutes on a loaded 2-core machine.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil
import pytest

from skulk.worker.runner.breaker import CRASH_BREAKER_MAX_CRASHES
from tests.cluster.harness import agreed, cluster, node_id
from tests.nodeproc import NodeProcess, free_port, wait_for

SEED = int(os.environ.get("SKULK_CHAOS_SEED", "4"))
"""The default seed draws each fault kind once."""
FAULTS = int(os.environ.get("SKULK_CHAOS_FAULTS", "4"))
FAULT_KINDS = ("kill9-server", "sigstop-server", "kill9-master", "kill9-runner")
MODEL = "local/tiny-llama-gguf"
PROMPT = [{"role": "user", "content": "the the the"}]
STREAM_TOKENS = 64
PAUSE_S = 5.0
"""How long a SIGSTOPped node stays frozen: past the 1 s transport lease (its presence goes)."""
RECOVERY_DEADLINE_S = 120.0
"""Hang guard per fault: prune, re-placement and a llama.cpp load on a loaded 2-core machine."""
CLIENT_TIMEOUT_S = 60.0
"""A request still open after this long counts as hung."""
CLIENTS = 2
FINAL_AGREEMENT_S = 30.0
"""Hang guard for every node to agree once the last fault has recovered and the clients stopped."""

pytestmark = pytest.mark.timeout(int(60 + FAULTS * (RECOVERY_DEADLINE_S + 60)))


@dataclass
class Node:
    name: str
    api_port: int
    listen_port: int
    process: NodeProcess | None = None


@dataclass
class Phase:
    """The step the run is in, as the client threads read it: which fault is current and
    when it was injected (monotonic), so every outcome can say where it happened."""

    step: int = -1
    kind: str = "warm-up"
    faulted_at: float | None = None

    def label(self, now: float) -> str:
        since = f", {now - self.faulted_at:.1f}s after the fault" if self.faulted_at is not None else ""
        return f"step {self.step} {self.kind}{since}"


@dataclass
class Ledger:
    outcomes: Counter = field(default_factory=Counter)
    untyped: list[str] = field(default_factory=list)
    index_regressions: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    typed: Counter = field(default_factory=Counter)
    by_step: dict[str, Counter] = field(default_factory=dict)
    """Outcomes (and typed codes) per step the request started in: where each kind came from."""

    def record(self, outcome: str, detail: str = "", *, step: str = "", context: str = "") -> None:
        with self.lock:
            self.outcomes[outcome] += 1
            self.by_step.setdefault(step, Counter())[f"{outcome}:{detail}" if outcome == "typed" else outcome] += 1
            if outcome == "untyped":
                self.untyped.append(f"{detail} [{context}]" if context else detail)
            elif outcome == "typed":
                self.typed[detail] += 1


def _one_request(url: str, headers: dict[str, str] | None = None) -> tuple[str, str]:
    """(outcome, detail) of one streamed chat: completed, typed, or untyped."""
    body = {"model": MODEL, "messages": PROMPT, "max_tokens": STREAM_TOKENS, "temperature": 0, "stream": True}
    try:
        with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=CLIENT_TIMEOUT_S,
                          headers=headers) as response:
            if response.status_code != 200:
                error = json.loads(response.read()).get("error") or {}
                typed = isinstance(error, dict) and error.get("message") and (error.get("type") or error.get("code"))
                return ("typed", error.get("code") or error.get("type")) if typed else ("untyped", str(error))
            for line in response.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = json.loads(line[len("data: "):])
                if "error" in event:
                    error = event["error"]
                    return ("typed", error.get("code") or error.get("type")) if error.get("message") else (
                        "untyped", str(error))
                if event["choices"] and event["choices"][0].get("finish_reason"):
                    return "completed", ""
            return "untyped", "the stream ended without a finish reason or an error"
    except (httpx.HTTPError, ValueError) as exc:
        return "untyped", repr(exc)


def _open_commands(node: NodeProcess) -> str:
    """The entry node's streams still open now, oldest first, each with its age and what
    /state says of its task (status, instance, serving node, runner state): taken the
    moment a client gives up, it names the command that hung and where it stood."""
    try:
        records = node.get("/v1/diagnostics/node").json()["flightRecorder"]["records"]
        state = node.get("/state").json()
    except (httpx.HTTPError, ValueError, KeyError) as exc:
        return f"open commands unknown: {exc!r}"
    opened = {r["command_id"]: r["at"] for r in records if r.get("kind") == "request" and r.get("phase") == "opened"}
    for r in records:
        if r.get("kind") == "request" and r.get("phase") == "ended":
            opened.pop(r["command_id"], None)
    tasks = {t.get("commandId"): t for t in state.get("tasks", {}).values()}
    described = []
    for command_id, at in sorted(opened.items(), key=lambda item: item[1]):
        task = tasks.get(command_id)
        if task is None:
            described.append(f"{command_id} open {time.time() - at:.0f}s, no task in /state")
            continue
        instance = state.get("instances", {}).get(task.get("instanceId"), {})
        shard = (instance.get("shards") or [{}])[0]
        runner = state.get("runners", {}).get(shard.get("runnerId"), {})
        described.append(f"{command_id} open {time.time() - at:.0f}s, task {task.get('taskId')} "
                         f"{task.get('status')} on instance {task.get('instanceId')} node {shard.get('nodeId')} "
                         f"runner {runner.get('state')}")
    return "open commands: " + ("; ".join(described) or "none")


def _runner_pids(node: NodeProcess) -> list[psutil.Process]:
    try:
        return psutil.Process(node.proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def test_chaos_schedule_keeps_the_invariants(spawn_node, tmp_path: Path) -> None:
    rng = random.Random(SEED)
    schedule = [rng.choice(FAULT_KINDS) for _ in range(FAULTS)]
    print(f"\nchaos seed {SEED}: schedule {schedule}")
    nodes = {n: Node(n, free_port(), free_port()) for n in ("chaos-a", "chaos-b", "chaos-c")}
    entry_name = "chaos-a"

    def start(node: Node) -> NodeProcess:
        args = ["--listen", f"tcp/127.0.0.1:{node.listen_port}", "--cluster-key", "chaos-key", "--node-name",
                node.name]
        if node.name != entry_name:
            args += ["--bootstrap-peers", f"tcp/127.0.0.1:{nodes[entry_name].listen_port}"]
        else:
            args += ["--bootstrap-peers", ",".join(f"tcp/127.0.0.1:{n.listen_port}" for n in nodes.values()
                                                   if n.name != entry_name)]
        node.process = spawn_node(node.name, data_dir=tmp_path / node.name, extra_args=args, port=node.api_port)
        return node.process

    for node in nodes.values():
        start(node)
    for node in nodes.values():
        node.process.wait_ready()
    live = lambda: [n.process for n in nodes.values()]  # noqa: E731
    wait_for(lambda: agreed(live(), members=3), timeout_s=60, interval_s=0.25, what="a 3-node cluster")
    entry = nodes[entry_name].process

    def serving_node() -> str | None:
        state = entry.get("/state").json()
        mine = [i for i in state["instances"].values() if i["modelId"] == MODEL]
        if len(mine) != 1 or not all(state["runners"].get(s["runnerId"], {}).get("state") in ("Ready", "Running")
                                     for s in mine[0]["shards"]):
            return None
        ids = {node_id(n.process): name for name, n in nodes.items()}
        return ids.get(mine[0]["shards"][0]["nodeId"])

    def serves() -> bool:
        reply = httpx.post(entry.url + "/v1/chat/completions", timeout=60,
                           json={"model": MODEL, "messages": PROMPT, "max_tokens": 4})
        return reply.status_code == 200

    def placed() -> bool:
        body = {"modelId": MODEL, "minNodes": 1, "excludedNodes": [node_id(entry)]}
        return httpx.post(entry.url + "/place_instance", json=body, timeout=10).status_code == 200

    def model_instance_id() -> str | None:
        return next((i for i, inst in entry.get("/state").json()["instances"].items() if inst["modelId"] == MODEL),
                    None)

    def refused_as_not_serving() -> bool:
        reply = httpx.post(entry.url + "/v1/chat/completions", timeout=60,
                           json={"model": MODEL, "messages": PROMPT, "max_tokens": 4})
        return reply.status_code == 503 and reply.json()["error"]["code"] == "model_not_serving"

    runner_kills: Counter[str] = Counter()
    """Runner kills per instance: the third within the breaker's window makes the worker give up."""

    wait_for(placed, timeout_s=60, interval_s=0.5, what="the placement")
    wait_for(serving_node, timeout_s=RECOVERY_DEADLINE_S, interval_s=0.5, what="the model Ready")

    ledger = Ledger()
    stop = threading.Event()

    phase = Phase()
    began = time.monotonic()

    def client() -> None:
        while not stop.is_set():
            started, at_start, step_at_start = time.monotonic(), phase.label(time.monotonic()), f"{phase.step} {phase.kind}"
            outcome, detail = _one_request(entry.url)
            context = ""
            if outcome == "untyped":
                now = time.monotonic()
                context = (f"started at t={started - began:.1f}s in {at_start}; gave up after {now - started:.1f}s "
                           f"in {phase.label(now)}; {_open_commands(entry)}")
            ledger.record(outcome, detail, step=step_at_start, context=context)

    def index_monitor() -> None:
        last: dict[tuple[str, int], int] = {}
        while not stop.is_set():
            for node in list(nodes.values()):
                process = node.process
                with contextlib.suppress(httpx.HTTPError, ValueError, AttributeError):
                    idx = process.get("/v1/cluster").json()["lastEventIdx"]
                    key = (node.name, process.proc.pid)
                    if idx is not None and idx < last.get(key, -1):
                        with ledger.lock:
                            ledger.index_regressions.append(f"{node.name}: {last[key]} -> {idx}")
                    if idx is not None:
                        last[key] = max(idx, last.get(key, -1))
            stop.wait(0.5)

    threads = [threading.Thread(target=client, daemon=True, name=f"client-{i}") for i in range(CLIENTS)]
    threads.append(threading.Thread(target=index_monitor, daemon=True, name="index-monitor"))
    for thread in threads:
        thread.start()
    timings: list[str] = []
    try:
        for step, kind in enumerate(schedule):
            wait_for(lambda: ledger.outcomes["completed"] > 0, timeout_s=60, interval_s=0.1,
                     what="a completed request before the fault")
            server = serving_node()
            master_name = {node_id(n.process): name for name, n in nodes.items()}.get(
                cluster(entry)["masterNodeId"])
            victim_name = server if kind != "kill9-master" else master_name
            if victim_name in (None, entry_name):  # the role is the entry node: hit the other one
                victim_name = next(n for n in nodes if n not in (entry_name, server if kind == "kill9-master" else None))
            victim = nodes[victim_name]
            faulted_at = time.monotonic()
            phase.step, phase.kind, phase.faulted_at = step, kind, faulted_at
            if kind == "kill9-runner":
                instance_id = model_instance_id()
                runners = _runner_pids(nodes[server].process) if server else []
                for runner in runners:
                    with contextlib.suppress(psutil.NoSuchProcess):
                        runner.kill()
                detail = f"runner(s) {[r.pid for r in runners]} on {server}"
                runner_kills[instance_id] += 1 if runners and instance_id else 0
                if instance_id and runner_kills[instance_id] >= CRASH_BREAKER_MAX_CRASHES:
                    # The worker's crash breaker gives up on a runner that keeps crashing; the
                    # master re-places the instance away from that node by itself, or, when
                    # nothing else admits it (or at the last repair hop), keeps it Failed and
                    # the model is refused typed until an operator re-places it.
                    def replaced_or_refused(old: str = instance_id) -> str | None:
                        current = model_instance_id()
                        if current is not None and current != old:
                            return "replaced"
                        return "refused" if refused_as_not_serving() else None

                    outcome = wait_for(replaced_or_refused, timeout_s=RECOVERY_DEADLINE_S, interval_s=0.5,
                                       what="the instance re-placed (or refused typed) after the crash breaker tripped")
                    if outcome == "refused":
                        httpx.delete(f"{entry.url}/instance/{instance_id}", timeout=10).raise_for_status()
                        wait_for(lambda: model_instance_id() is None, timeout_s=60, interval_s=0.5,
                                 what="the given-up instance deleted")
                        wait_for(placed, timeout_s=60, interval_s=0.5, what="the placement again")
                    detail += f"; the crash breaker tripped: {outcome}"
            elif kind == "sigstop-server":
                victim.process.signal(signal.SIGSTOP)
                time.sleep(PAUSE_S)  # the freeze is the fault itself, not a synchronisation
                victim.process.signal(signal.SIGCONT)
                detail = f"{victim_name} frozen {PAUSE_S:g}s"
            else:
                runners = _runner_pids(victim.process)
                victim.process.signal(signal.SIGKILL)
                for runner in runners:
                    with contextlib.suppress(psutil.NoSuchProcess):
                        runner.kill()
                victim.process.wait_exit(timeout_s=10)
                start(victim).wait_ready()
                detail = f"{victim_name} killed and restarted"
            try:
                wait_for(lambda: agreed(live(), members=3), timeout_s=RECOVERY_DEADLINE_S, interval_s=0.5,
                         what="three members agreeing again")
                wait_for(lambda: serving_node() and serves(), timeout_s=RECOVERY_DEADLINE_S, interval_s=0.5,
                         what="the model serving again")
            except TimeoutError as exc:
                sessions = {}
                for name, n in nodes.items():
                    with contextlib.suppress(httpx.HTTPError, ValueError, KeyError):
                        sessions[name] = cluster(n.process)["sessionId"]
                others = {s for name, s in sessions.items() if name != victim_name}
                if kind == "sigstop-server" and len(others) == 1 and sessions.get(victim_name) not in others:
                    # The old signature of a zenoh fault (issue 18): a node paused while it led
                    # resumes still leading its old session, nothing it sends arriving. The node
                    # now kicks zenoh's threads when a challenge goes unanswered or it is left
                    # alone (routing/hearing.py), and a leader back from a stall holds its
                    # indexing until it hears the newer master; not met in 40 runs since. Kept
                    # as an expected failure with the evidence, never as a pass, so that the
                    # fault, if it comes back, reports itself.
                    hearing = {}
                    for name, n in nodes.items():
                        if n.process is None:
                            continue
                        with contextlib.suppress(httpx.HTTPError, ValueError, KeyError):
                            hearing[name] = n.process.get("/v1/diagnostics/node").json()["transport"]["hearing"]
                    pytest.xfail(f"known defect (issue 18): step {step} {kind}: {victim_name} resumed in "
                                 f"session {sessions.get(victim_name)} while the others follow {others}; "
                                 f"hearing {hearing}: {exc}")
                logs = "\n".join(f"--- {n.name}\n{n.process.log()[-2500:]}" for n in nodes.values())
                with contextlib.suppress(Exception):
                    state = entry.get("/state").json()
                    logs += f"\ninstances {state['instances']}\nrunners {state['runners']}\ntasks {len(state['tasks'])}"
                    reply = httpx.post(entry.url + "/v1/chat/completions", timeout=60,
                                       json={"model": MODEL, "messages": PROMPT, "max_tokens": 4})
                    logs += f"\nchat: {reply.status_code} {reply.text[:500]}"
                raise AssertionError(f"step {step} {kind}: {exc}\n{logs}") from None
            timings.append(f"step {step}: {kind} ({detail}) at t={faulted_at - began:.1f}s: recovered in "
                           f"{time.monotonic() - faulted_at:.1f}s")
            print(timings[-1])
    finally:
        stop.set()
        for node in nodes.values():
            with contextlib.suppress(ProcessLookupError, AttributeError):
                node.process.signal(signal.SIGCONT)
        for thread in threads:
            thread.join(timeout=CLIENT_TIMEOUT_S + 10)
    hung = [t.name for t in threads if t.is_alive()]
    # Agreement once the faults have stopped: a snapshot taken while the last step's events are
    # still being replicated can catch one node an event behind (seen once: "stateHash agreed: NO"
    # with every other invariant met), so wait for it, bounded.
    final = None
    with contextlib.suppress(TimeoutError):
        final = wait_for(lambda: agreed(live(), members=3), timeout_s=FINAL_AGREEMENT_S, interval_s=0.5,
                         what="the final agreement")
    with contextlib.suppress(httpx.HTTPError, ValueError, KeyError):
        timings.append(f"entry's command resends: {entry.get('/v1/diagnostics/node').json()['commandResends']}")

    def disagreement() -> str:
        views = {}
        for name, n in nodes.items():
            with contextlib.suppress(httpx.HTTPError, ValueError, KeyError, AttributeError):
                view = cluster(n.process)
                views[name] = {k: view[k] for k in ("masterNodeId", "sessionId", "stateHash", "lastEventIdx")} | {
                    "alive": sum(1 for m in view["nodes"] if m["alive"]), "members": len(view["nodes"])}
        return str(views)

    per_step = "\n".join(f"    {step}: {dict(counts)}" for step, counts in ledger.by_step.items())
    report = (f"invariants (seed {SEED}, schedule {schedule}):\n"
              f"  requests: {dict(ledger.outcomes)}; typed errors by code: {dict(ledger.typed)}; "
              f"untyped: {len(ledger.untyped)}; hung clients: {hung}\n"
              f"  by the step a request started in:\n{per_step}\n"
              f"  steps:\n" + "".join(f"    {t}\n" for t in timings) +
              f"  index regressions: {ledger.index_regressions or 'none'}\n"
              f"  stateHash agreed: {final['stateHash'] if final else f'NO: {disagreement()}'}\n"
              f"  model serves: {serves()}")
    print(report)
    # CI shows the assertion and a short tail: each message carries the whole report.
    assert not hung, f"{hung}\n{report}"
    assert not ledger.untyped, "\n".join(["untyped outcomes:", *ledger.untyped[:5], report])
    assert ledger.outcomes["completed"] > 0
    assert not ledger.index_regressions, report
    assert final is not None, report
    assert serves()
