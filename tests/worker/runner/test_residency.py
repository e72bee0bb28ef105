"""Residency: the pure TTL rules, and a real runner subprocess (tiny GGUF) that unloads its
model once idle past the placement's idleTtl and reloads it for the next request, which
waits and gets the tokens it would have got anyway."""

from __future__ import annotations

import pytest

from skulk.shared.residency import KeepAliveInvalid, idle_check_in_s, idle_ttl, parse_keep_alive, unload_due
from skulk.worker.runner.messages import StatusChanged
from skulk.worker.runner.supervisor import RunnerSupervisor
from tests.worker.runner.test_supervisor import READY_TIMEOUT_S, Reports
from tests.worker.tiny_gguf import (
    RUNNER,
    prompt_params,
    text_task,
    tiny_gguf,  # noqa: F401  (fixture)
    tiny_gguf_card,
    tiny_instance,
)

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize(
    "placement, keep_alive, ttl",
    [(None, None, None), (30.0, None, 30.0), (30.0, 5.0, 5.0), (30.0, -1.0, None), (None, 0.0, 0.0),
     (None, -1.0, None)],
)
def test_idle_ttl(placement, keep_alive, ttl) -> None:
    assert idle_ttl(placement, keep_alive) == ttl


@pytest.mark.parametrize(
    "ttl, loaded, busy, idle_for, due",
    [(None, True, False, 1e9, False), (10.0, True, False, 10.0, True), (10.0, True, False, 9.9, False),
     (10.0, False, False, 99.0, False), (10.0, True, True, 99.0, False), (0.0, True, False, 0.0, True)],
)
def test_unload_due(ttl, loaded, busy, idle_for, due) -> None:
    assert unload_due(ttl, loaded, busy, idle_for) is due


@pytest.mark.parametrize(
    "ttl, loaded, busy, idle_for, wait_s",
    [(None, True, False, 1e9, None),   # no TTL: only a message can change anything
     (10.0, False, False, 99.0, None),  # unloaded already: the next request reloads
     (None, True, True, 0.0, None),
     (10.0, True, True, 0.0, 0.2),      # busy: the last task may end at any moment
     (10.0, True, False, 4.0, 6.0),     # idle: wake exactly when the TTL runs out
     (10.0, True, False, 10.0, 0.0),    # due now
     (10.0, True, False, 12.0, 0.0),    # overdue (a long message): at once
     (0.0, True, False, 0.0, 0.0)],     # keep_alive 0: unload as soon as idle
)
def test_idle_check_in_s(ttl, loaded, busy, idle_for, wait_s) -> None:
    assert idle_check_in_s(ttl, loaded, busy, idle_for, busy_recheck_s=0.2) == wait_s
    if wait_s == 0.0:
        assert unload_due(ttl, loaded, busy, idle_for)  # the wake-up finds the unload due


def test_parse_keep_alive_refuses_non_durations() -> None:
    assert parse_keep_alive("2h") == 7200.0
    with pytest.raises(KeepAliveInvalid):
        parse_keep_alive("2 hours")


def residency(reports: Reports) -> list[bool]:
    return [m.resident for m in reports.messages if isinstance(m, StatusChanged) and m.status.state == "Ready"]


async def test_an_idle_runner_unloads_and_the_next_request_reloads_and_waits(tiny_gguf) -> None:
    card = tiny_gguf_card()
    instance = tiny_instance(card).model_copy(update={"idle_ttl_s": 0.3})
    reports = Reports()
    supervisor = RunnerSupervisor(instance=instance, runner_id=RUNNER, card=card, model_path=str(tiny_gguf),
                                  on_report=reports, n_threads=1)
    await supervisor.start()
    try:
        await reports.wait_for(lambda: reports.state() == "Ready", READY_TIMEOUT_S)
        params = prompt_params("The weather today is", temperature=0, max_tokens=8)
        first = text_task("before", params)
        supervisor.submit(first)
        await reports.wait_for(lambda: reports.done(first))
        # Idle past the TTL: the runner says it let the model go, and stays Ready.
        await reports.wait_for(lambda: residency(reports)[-1:] == [False])
        assert reports.state() == "Ready"
        second = text_task("after", params)
        supervisor.submit(second)
        await reports.wait_for(lambda: reports.done(second))
        assert reports.done(second).outcome == "completed"
        assert [p.chunk.text for p in reports.payloads(second)] == [p.chunk.text for p in reports.payloads(first)]
        assert True in residency(reports)[residency(reports).index(False):]  # reloaded for it
    finally:
        await supervisor.shutdown(timeout_s=5.0)
