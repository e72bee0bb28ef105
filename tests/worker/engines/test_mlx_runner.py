"""MLX instances through real runner processes and their supervisors: a single rank, and a
2-rank pipeline whose rank 0 alone takes tasks and streams the tokens one rank would; a
group that loses a rank mid-request ends the client's stream with an error naming the lost
rank's node, and its rank 0 (non-zero exit), within the eval deadline instead of hanging."""

from __future__ import annotations

import os
import signal
import time

import pytest
import pytest_asyncio

from skulk.models.cards import builtin_cards_dir, load_card
from skulk.shared.types.chunks import StreamPayload
from skulk.shared.types.tasks import TextGeneration
from skulk.worker.engines.mlx.group import EVAL_TIMEOUT_ENV, EXIT_GROUP_WEDGED
from skulk.worker.runner.supervisor import RunnerSupervisor
from tests.worker.engines.mlx_ranks import NODE, local_instance
from tests.worker.runner.test_supervisor import Reports
from tests.worker.tiny_gguf import text_task

pytestmark = pytest.mark.timeout(180)

CARD = load_card(builtin_cards_dir() / "local--tiny-llama.toml")
READY_TIMEOUT_S = 90.0
"""Spawn, imports (mlx, mlx-lm, transformers) and the group's warm-up, on a busy 2-core box."""
EVAL_TIMEOUT_S = 4.0
HANG_GUARD_S = 120.0
"""Bounds a hang in a lost-rank test; no outcome depends on it on a loaded machine."""


def task(name: str, prompt: str, max_tokens: int) -> TextGeneration:
    from skulk.shared.types.tasks import TextGenerationParams

    params = TextGenerationParams(model_id=CARD.model_id, prompt=prompt, max_tokens=max_tokens, temperature=0)
    return text_task(name, params)


def token_ids(reports: Reports, t: TextGeneration) -> list[int]:
    return [p.chunk.token_id for p in reports.payloads(t) if isinstance(p, StreamPayload)]


@pytest.fixture(scope="module")
def tiny_hf(tmp_path_factory):
    from skulk.artifacts.resolve import ensure_local_model

    return ensure_local_model(CARD, tmp_path_factory.mktemp("mlx-runner-models"))


@pytest_asyncio.fixture
async def group(tiny_hf, monkeypatch):
    """Start every rank of an instance as a supervised runner; all are shut down at teardown."""
    monkeypatch.setenv(EVAL_TIMEOUT_ENV, str(EVAL_TIMEOUT_S))  # spawned runners inherit it
    started: list[RunnerSupervisor] = []

    async def start(world: int, sharding: str = "Pipeline") -> list[tuple[RunnerSupervisor, Reports]]:
        instance = local_instance(CARD, world, sharding)
        out = []
        for shard in instance.shards:
            reports = Reports()
            supervisor = RunnerSupervisor(instance=instance, runner_id=shard.runner_id, card=CARD,
                                          model_path=str(tiny_hf), on_report=reports, n_threads=1)
            started.append(supervisor)
            await supervisor.start()
            out.append((supervisor, reports))
        for supervisor, reports in out:
            await reports.wait_for(lambda r=reports: r.state() in ("Ready", "Failed"), READY_TIMEOUT_S)
            assert reports.state() == "Ready", (supervisor.runner_id, reports.statuses(), reports.messages[-3:])
        return out

    yield start
    for supervisor in reversed(started):  # followers first is not required; rank 0 tells them anyway
        if not supervisor.exited:
            await supervisor.shutdown(timeout_s=5.0)


async def test_single_and_pipeline_runners_stream_the_same_tokens(group) -> None:
    ((single, single_reports),) = await group(1)
    reference = task("one", "The cluster by the sea", 16)
    single.submit(reference)
    await single_reports.wait_for(lambda: single_reports.done(reference))
    expected = token_ids(single_reports, reference)
    assert len(expected) == 16

    (leader, leader_reports), (follower, follower_reports) = await group(2)
    for n in range(2):  # two requests in a row: the followers return to idle between them
        t = task(f"two-{n}", "The cluster by the sea", 16)
        leader.submit(t)
        await leader_reports.wait_for(lambda t=t: leader_reports.done(t))
        assert leader_reports.done(t).outcome == "completed"
        assert token_ids(leader_reports, t) == expected
    assert follower_reports.of_task(t) == []  # followers never stream to clients
    assert follower.status.state == "Ready"


async def test_a_lost_rank_ends_rank_0_and_the_stream_within_the_eval_deadline(group) -> None:
    (leader, leader_reports), (follower, _) = await group(2)
    t = task("wedge", "the the the the", 1500)
    leader.submit(t)
    await leader_reports.wait_for(lambda: len(leader_reports.payloads(t)) >= 3)
    os.kill(follower.pid, signal.SIGKILL)
    started = time.monotonic()
    # Without the eval deadline rank 0 would wait for the dead rank forever: the guard below
    # only bounds a hang, it times nothing (the elapsed time is printed).
    await leader_reports.wait_for(lambda: leader_reports.done(t), HANG_GUARD_S)
    assert leader_reports.done(t).outcome == "failed"
    terminal = leader_reports.terminal(t)
    assert terminal.error_type == "GroupBroken", terminal
    assert f"lost node {NODE}" in terminal.error_message and "rank 1" in terminal.error_message
    await leader_reports.wait_for(lambda: leader.exited, HANG_GUARD_S)
    assert leader.exitcode not in (0, None)
    assert leader.exitcode in (EXIT_GROUP_WEDGED, 1)
    print(f"rank 0 failed the stream and exited {time.monotonic() - started:.1f} s after rank 1 was killed "
          f"(eval deadline {EVAL_TIMEOUT_S} s)")
