"""A donor that goes silent without dying (its process stopped with SIGSTOP: the kernel keeps
its TCP connection up and answers keepalive probes) must not hang its driver. Real parts: the
driver is the in-process llama.cpp engine over the tiny GGUF in one process, the donor a
`PoolDonorEngine` (ggml RPC server behind its gate) in another, the authenticated channel
between them on loopback. Deterministic: the driver stops after its third token until the
test has stopped the donor, so the next decode is the one that meets the silence."""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import signal
import threading
import time
import uuid

import pytest

from skulk.pool.layout import derive_pool_key
from skulk.shared.types.instances import Instance, ShardAssignment
from skulk.shared.types.tasks import TextGenerationParams
from tests.worker.tiny_gguf import tiny_gguf, tiny_gguf_card  # noqa: F401

pytestmark = pytest.mark.timeout(240)

KEY = derive_pool_key("silent-donor-test")
DRIVER_SILENCE_DEADLINE_S = 5.0
DONOR_HEARTBEAT_S = 0.25
FATAL_EXIT = 3


def _instance() -> Instance:
    return Instance(
        instance_id=f"silent-{uuid.uuid4().hex[:12]}", model_id="local/tiny-llama-gguf", sharding="Pipeline",
        context_token_limit=512, ring_hosts=["127.0.0.1", "127.0.0.1"],
        shards=[ShardAssignment(node_id=f"n{r}", runner_id=f"r{r}", rank=r, world_size=2, start_layer=3 * r,
                                end_layer=3 * r + 3, backend="llama_cpp-cpu") for r in range(2)],
    )


def _donor(instance: Instance, path: str) -> None:
    from skulk.pool import channel
    from skulk.worker.engines.base import ShardSpec
    from skulk.worker.engines.llama_cpp.pool import PoolDonorEngine

    channel.HEARTBEAT_INTERVAL_S = DONOR_HEARTBEAT_S  # well inside the driver's deadline on a loaded machine
    PoolDonorEngine().load(ShardSpec(instance=instance, runner_id="r1", card=tiny_gguf_card(), model_path=path,
                                     n_threads=1, pool_key=KEY))
    while True:
        time.sleep(3600)


def _driver(instance: Instance, path: str, events, resume) -> None:
    from skulk.pool import channel
    from skulk.worker.engines.base import ShardSpec
    from skulk.worker.engines.llama_cpp.engine import LlamaCppEngine

    channel.SILENCE_DEADLINE_S = DRIVER_SILENCE_DEADLINE_S  # the test's wait, not the product's

    def fatal(kind: str, message: str) -> None:  # as the runner's: report, then never return
        events.put(("fatal", kind, message))
        events.close()
        events.join_thread()
        os._exit(FATAL_EXIT)

    engine = LlamaCppEngine()
    engine.set_fatal_handler(fatal)
    engine.load(ShardSpec(instance=instance, runner_id="r0", card=tiny_gguf_card(), model_path=path, n_threads=1,
                          pool_key=KEY))
    params = TextGenerationParams(model_id="local/tiny-llama-gguf", prompt="the the the the", max_tokens=200,
                                  temperature=0)
    for n, _token in enumerate(engine.generate(params, threading.Event())):
        events.put(("token", n, ""))
        if n == 2:
            events.put(("paused", n, ""))
            resume.wait(120)
    events.put(("finished", 0, ""))


def _next(events, driver, what: str, deadline_s: float):
    """The driver's next event; fails at once when the driver died without saying why."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        try:
            return events.get(timeout=0.5)
        except queue.Empty:
            if not driver.is_alive() and events.empty():
                raise AssertionError(f"the driver exited ({driver.exitcode}) before its {what}") from None
    raise AssertionError(f"no {what} within {deadline_s:.0f} s")


def test_a_stopped_donor_ends_the_driver_with_pool_member_lost_naming_it(tiny_gguf):
    ctx = mp.get_context("spawn")
    instance = _instance()
    events, resume = ctx.Queue(), ctx.Event()
    donor = ctx.Process(target=_donor, args=(instance, str(tiny_gguf)), daemon=True)
    driver = ctx.Process(target=_driver, args=(instance, str(tiny_gguf), events, resume), daemon=True)
    donor.start()
    driver.start()
    try:
        while (event := _next(events, driver, "third token", 180))[0] != "paused":
            assert event[0] == "token", event
        os.kill(donor.pid, signal.SIGSTOP)  # alive to the kernel, silent to everyone
        resume.set()
        event = _next(events, driver, "end", 120)  # a bound for the test, far above the deadline
        assert event[0] == "fatal", f"the driver went on without its donor: {event}"
        _, kind, message = event
        assert kind == "PoolMemberLost"
        assert "node n1 (rank 1)" in message and "no frame from the peer" in message, message
        driver.join(timeout=30)
        assert driver.exitcode == FATAL_EXIT
    finally:
        for proc in (driver, donor):
            if proc.is_alive():
                proc.kill()  # SIGKILL ends a stopped process too
            proc.join(timeout=30)
