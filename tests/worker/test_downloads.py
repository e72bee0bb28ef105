"""The artifact coordinator's decisions (skulk.worker.downloads), one table each, and the few
places its shell only moves data (progress publication, forgetting an evicted copy), with
fakes instead of a hub."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace

import pytest

from skulk.artifacts.plan import ArtifactFailure, FailureCooldown
from skulk.models.artifact_errors import ArtifactUnavailable
from skulk.models.downloads import DownloadFailed, ProgressGate
from skulk.routing.router import RouterError
from skulk.shared.types.cards import ModelCard
from skulk.shared.types.events import StagedModelEvicted
from skulk.shared.types.ids import DownloadAttemptId, ModelId, NodeId
from skulk.shared.types.state import DownloadStatusCompleted, DownloadStatusFailed, DownloadStatusPending, State
from skulk.shared.types.telemetry import DownloadProgress
from skulk.worker.downloads import (
    ArtifactDownloads,
    Attempt,
    completed_bytes,
    download_failure_reason,
    failures_at,
    forgets_on_eviction,
    progress_key,
    progress_step,
    reports_completed,
    staged_copy,
    staging_in_use,
    unavailable_failure,
    unexpected_failure,
)
from tests.mockhub import GGUF_FILE, TINY_GGUF_REPO, TINY_MLX_REPO, hub_card

COOLDOWN = FailureCooldown(cooldown_s=60.0)
ATTEMPT = Attempt(NodeId("node-a"), ModelId("acme/tiny"), DownloadAttemptId("att-1"))
STAGING = Path("/data/staging")


# -- failures --------------------------------------------------------------------------------


@pytest.mark.parametrize(("exc", "expected"), [
    ("transient", ArtifactFailure("downloading m failed (transient): net", 160.0)),
    ("deadline", ArtifactFailure("downloading m failed (deadline): net", 160.0)),
    ("cancelled", ArtifactFailure("downloading m failed (cancelled): net", 160.0)),
    ("disk", ArtifactFailure("downloading m failed (disk): net", 160.0)),
    ("not_found", ArtifactFailure("downloading m failed (not_found): net", None)),
    ("unauthorized", ArtifactFailure("downloading m failed (unauthorized): net", None)),
    ("error", ArtifactFailure("downloading m failed (error): net", None)),
    (None, ArtifactFailure("model m is unavailable: no model card", None)),
])
def test_unavailable_failure_cools_down_only_a_passing_download_failure(exc, expected):
    error = ArtifactUnavailable("m", "no model card") if exc is None else DownloadFailed("m", "net", exc)
    assert unavailable_failure(error, COOLDOWN, now=100.0) == expected


@pytest.mark.parametrize(("exc", "reason"), [
    (ValueError("bad"), "ValueError: bad"),
    (OSError("disk gone"), "OSError: disk gone"),
    (RuntimeError(), "RuntimeError: "),
])
def test_an_unexpected_failure_names_the_error_and_never_cools_down(exc, reason):
    assert unexpected_failure(exc) == ArtifactFailure(reason, None)


@pytest.mark.parametrize(("failures", "now", "kept"), [
    ("empty", 0.0, set()),
    ("a", 10.0, {"a", "b"}),  # before b's retry time: both hold
    ("a", 50.0, {"a"}),  # at b's retry time it is forgotten
    ("a", 1e9, {"a"}),  # a failure with no retry time holds for good
])
def test_failures_at_drops_the_expired_and_gives_reasons_by_model(failures, now, kept):
    records = {} if failures == "empty" else {
        "a": ArtifactFailure("needs an operator"), "b": ArtifactFailure("hub down", retry_at=50.0)}
    live, reasons = failures_at(records, now)
    assert set(live) == kept
    assert reasons == {ModelId(m): records[m].reason for m in kept}


@pytest.mark.parametrize(("exc", "reason"), [
    (DownloadFailed("m", "repo does not exist", "not_found"), "repo does not exist"),
    (ArtifactUnavailable("m", "companion x missing"), "companion x missing"),
    (ValueError("boom"), "ValueError: boom"),
])
def test_download_failure_reason(exc, reason):
    assert download_failure_reason(exc) == reason


# -- progress ---------------------------------------------------------------------------------


def _reading(done: int, total: int) -> DownloadProgress:
    return DownloadProgress(node_id=ATTEMPT.node_id, model_id=ATTEMPT.model_id, attempt_id=ATTEMPT.attempt_id,
                            downloaded_bytes=done, total_bytes=total)


@pytest.mark.parametrize(("name", "gate", "now", "done", "total", "after", "published"), [
    ("first sample", ProgressGate(), 5.0, 10, 100, ProgressGate(5.0, 10), True),
    ("too soon", ProgressGate(5.0, 10), 5.5, 20, 100, ProgressGate(5.0, 10), False),
    ("interval passed", ProgressGate(5.0, 10), 6.0, 20, 100, ProgressGate(6.0, 20), True),
    ("no forward motion", ProgressGate(5.0, 10), 9.0, 10, 100, ProgressGate(5.0, 10), False),
    ("backwards (a resume)", ProgressGate(5.0, 50), 9.0, 40, 100, ProgressGate(5.0, 50), False),
    ("the last one, always", ProgressGate(5.0, 10), 5.1, 100, 100, ProgressGate(5.1, 100), True),
])
def test_progress_step_publishes_or_throttles(name, gate, now, done, total, after, published):
    new_gate, reading = progress_step(gate, now, done, total, ATTEMPT)
    assert new_gate == after, name
    assert reading == (_reading(done, total) if published else None), name


def test_progress_key_is_one_latest_value_slot_per_model():
    assert progress_key(_reading(1, 2)) == ("download", "acme/tiny")


# -- completion -------------------------------------------------------------------------------


@pytest.mark.parametrize(("known", "reported"), [
    (None, True),
    (DownloadStatusPending(attempt_id=DownloadAttemptId("x")), True),
    (DownloadStatusFailed(attempt_id=DownloadAttemptId("x"), error_message="e"), True),
    (DownloadStatusCompleted(attempt_id=DownloadAttemptId("x"), total_bytes=5), False),
])
def test_a_copy_on_disk_is_reported_unless_state_has_it_completed(known, reported):
    assert reports_completed(known) is reported


@pytest.mark.parametrize(("measured", "otherwise", "size"), [
    (123, 999, 123), (0, 999, 0), (None, 999, 999), (None, 0, 0),
])
def test_completed_bytes_prefers_what_was_measured(measured, otherwise, size):
    assert completed_bytes(measured, otherwise) == size


# -- staging and staged copies ----------------------------------------------------------------


def _card(**companions: object) -> ModelCard:
    base = hub_card(TINY_GGUF_REPO, gguf_file=GGUF_FILE)
    return ModelCard.model_validate({**base.model_dump(by_alias=False), **companions})


@pytest.mark.parametrize(("in_use", "companions", "expected"), [
    (frozenset(), {}, {TINY_GGUF_REPO}),
    (frozenset({"other/live"}), {}, {"other/live", TINY_GGUF_REPO}),
    (frozenset(), {"vision_weights_repo": TINY_MLX_REPO}, {TINY_GGUF_REPO, TINY_MLX_REPO}),
    (frozenset({TINY_GGUF_REPO}), {"served_spec_draft_repo": "acme/draft", "served_spec_draft_file": "d.gguf",
                                   "served_spec_draft_size_bytes": 10, "runtime": {"speculative": "draft"}},
     {TINY_GGUF_REPO, "acme/draft"}),
])
def test_staging_never_evicts_what_is_in_use_or_this_transaction(in_use, companions, expected):
    assert staging_in_use(in_use, _card(**companions)) == expected


@pytest.mark.parametrize(("path", "root", "copy"), [
    ("/data/staging/acme--tiny/model.gguf", STAGING, STAGING / "acme--tiny"),
    ("/data/staging/acme--tiny", STAGING, STAGING / "acme--tiny"),
    ("/data/models/acme--tiny/model.gguf", STAGING, None),
    ("/data/staging/acme--tiny/model.gguf", None, None),  # no store bound
])
def test_staged_copy_of_a_runner_path(path, root, copy):
    assert staged_copy(path, root) == copy


@pytest.mark.parametrize(("path", "root", "forgets"), [
    (None, STAGING, False),  # nothing resolved
    (None, None, False),
    ("/data/staging/acme--tiny/model.gguf", STAGING, True),  # its staged copy is going
    ("/data/models/acme--tiny/model.gguf", STAGING, False),  # a direct download: not the store's to drop
    ("/data/models/acme--tiny/model.gguf", None, True),  # no store bound now: resolve again
])
def test_what_an_eviction_forgets(path, root, forgets):
    assert forgets_on_eviction(path, root) is forgets


# -- the shell only moves data ----------------------------------------------------------------


def _downloads(tmp_path, *, telemetry=None, broadcast=None, binding=None) -> ArtifactDownloads:
    spawned: list = []

    async def no_broadcast(_reading):
        return None

    downloads = ArtifactDownloads(
        node_id=NodeId("node-a"), models_dir=tmp_path, cards=dict, state=State,
        submit=lambda _event: None, broadcast=broadcast or no_broadcast,
        spawn=lambda coro: spawned.append(asyncio.ensure_future(coro)), wake=lambda: None,
        publish_telemetry=None if telemetry is None else (lambda key, reading: telemetry.append((key, reading))),
        store=None if binding is None else (lambda: binding),
    )
    downloads.spawned = spawned  # type: ignore[attr-defined]
    return downloads


async def test_progress_goes_through_the_telemetry_outbox_when_wired(tmp_path):
    telemetry: list = []
    downloads = _downloads(tmp_path, telemetry=telemetry)
    downloads.publish_progress(_reading(1, 2))
    assert telemetry == [(("download", "acme/tiny"), _reading(1, 2))]
    assert downloads.spawned == []  # type: ignore[attr-defined]


async def test_progress_goes_onto_the_topic_otherwise_and_a_lost_sample_is_only_logged(tmp_path):
    sent: list = []

    async def broadcast(reading):
        sent.append(reading)
        raise RouterError("no route")

    downloads = _downloads(tmp_path, broadcast=broadcast)
    downloads.publish_progress(_reading(1, 2))
    await asyncio.gather(*downloads.spawned)  # type: ignore[attr-defined]
    assert sent == [_reading(1, 2)]


def _evicted(model_id: str, node_ids: list[str] | None = None) -> SimpleNamespace:
    """What the listener reads of an IndexedEvent: its `event`."""
    return SimpleNamespace(event=StagedModelEvicted(event_id="e", model_id=model_id, node_ids=node_ids))


@pytest.mark.parametrize(("event", "resolved", "left"), [
    (_evicted("acme/a"), "staging/acme--a/m.gguf", set()),
    (_evicted("acme/a", ["node-a"]), "staging/acme--a/m.gguf", set()),
    (_evicted("acme/a", ["node-b"]), "staging/acme--a/m.gguf", {"acme/a"}),  # another node's copy
    (_evicted("acme/a"), "models/acme--a/m.gguf", {"acme/a"}),  # not a staged copy
    (_evicted("acme/other"), "staging/acme--a/m.gguf", {"acme/a"}),
    (object(), "staging/acme--a/m.gguf", {"acme/a"}),  # not an indexed event
])
def test_an_eviction_forgets_the_resolved_staged_path(tmp_path, event, resolved, left):
    from tests.worker.test_worker_downloads import _self_binding

    downloads = _downloads(tmp_path, binding=_self_binding(tmp_path))  # staging: tmp_path/staging
    downloads.artifacts[ModelId("acme/a")] = str(tmp_path / resolved)
    downloads.forget_evicted(event)
    assert set(downloads.artifacts) == left


def test_failures_now_and_retry_times_read_the_records(tmp_path):
    clock = iter([10.0, 100.0])
    downloads = ArtifactDownloads(
        node_id=NodeId("node-a"), models_dir=tmp_path, cards=dict, state=State, submit=lambda _e: None,
        broadcast=lambda _r: asyncio.sleep(0), spawn=lambda _c: None, wake=lambda: None, clock=lambda: next(clock),
    )
    downloads.failures = {"a": ArtifactFailure("kept"), "b": ArtifactFailure("passing", retry_at=50.0)}
    assert downloads.retry_times() == [None, 50.0]
    assert downloads.failures_now() == {"a": "kept", "b": "passing"}
    assert downloads.failures_now() == {"a": "kept"}
    assert downloads.retry_times() == [None]
