"""The field telemetry shell: hooks collect only while on, a flush sends the pending batch
exactly as previewed, failures are silent and counted, the switch is persisted."""

from __future__ import annotations

import stat
from datetime import UTC, datetime

import pytest

from skulk.observe.field_collector import TelemetryConfigUnwritable, TelemetryDisabledByEnv
from skulk.observe.field_telemetry import StreamEnded
from skulk.shared.types.events import IndexedEvent, NodeTimedOut
from tests.observe.telemetry_kit import FakeIngest, collector

ENDED = StreamEnded(command_id="c1", model_id="local/tiny-llama", workload="text", outcome="completed",
                    first_output_s=0.1, decode_s=1.0, output_chunks=5, prompt_tokens=7, completion_tokens=5)


def lost() -> IndexedEvent:
    return IndexedEvent(idx=3, origin="m", indexed_at=datetime(2026, 1, 1, tzinfo=UTC), event=NodeTimedOut(event_id="e", node_id="n1", last_event_age_s=40,
                                                  effective_age_s=31, timeout_s=30))


async def test_off_by_default_collects_nothing(tmp_path):
    telemetry = collector(tmp_path)
    telemetry.on_stream_ended(ENDED)
    telemetry.on_event_applied(lost())
    await telemetry.flush()
    status = telemetry.status()
    assert (status.enabled, status.pending, status.install_id) == (False, 0, None)
    assert not (tmp_path / "telemetry_install_id").exists() and not (tmp_path / "skulk.yaml").exists()


async def test_a_flush_sends_exactly_the_preview(tmp_path):
    ingest = FakeIngest()
    telemetry = collector(tmp_path, enabled=True, ingest=ingest)
    telemetry._install_id = telemetry._read_install_id()  # what run() does first
    telemetry.on_stream_ended(ENDED)
    telemetry.on_event_applied(lost())
    preview = telemetry.preview()
    assert [s.kind for s in preview.batch.samples] == ["generation", "node_lost"]
    await telemetry.flush()
    (sent,) = ingest.bodies
    assert sent.pop("url") == "http://127.0.0.1:9/in"
    assert sent == preview.batch.to_wire() | {"samples": [s.to_wire() for s in preview.batch.samples]}
    assert sent["installId"] == (tmp_path / "telemetry_install_id").read_text().strip()
    assert stat.S_IMODE((tmp_path / "telemetry_install_id").stat().st_mode) == 0o600
    status = telemetry.status()
    assert status.pending == 0 and status.counters.sent_batches == 1 and status.counters.sent_samples == 2


@pytest.mark.parametrize(("answer", "pending", "failed", "refused", "dropped"),
                         [(None, 1, 1, 0, 0), (503, 1, 1, 0, 0), (400, 0, 0, 1, 1)])
async def test_a_failed_send_is_silent_and_counted(tmp_path, answer, pending, failed, refused, dropped):
    telemetry = collector(tmp_path, enabled=True, ingest=FakeIngest(status=answer))
    telemetry._install_id = telemetry._read_install_id()
    telemetry.on_stream_ended(ENDED)
    await telemetry.flush()
    counters = telemetry.status().counters
    assert (telemetry.status().pending, counters.failed_sends, counters.refused_batches,
            counters.dropped_samples) == (pending, failed, refused, dropped)


async def test_only_the_master_counts_a_loss(tmp_path):
    telemetry = collector(tmp_path, enabled=True, i_am_master=False)
    telemetry.on_event_applied(lost())
    assert telemetry.status().pending == 0


async def test_a_hook_that_breaks_never_raises(tmp_path):
    telemetry = collector(tmp_path, enabled=True)
    telemetry._serving_hardware = lambda *_: 1 / 0  # a bug in a lookup
    telemetry.on_stream_ended(ENDED)
    assert telemetry.stats()["hookErrors"] == 1


async def test_the_switch_is_persisted_and_off_drops_what_was_collected(tmp_path):
    (tmp_path / "skulk.yaml").write_text("# mine\nnode:\n  name: a\n")
    (tmp_path / "skulk.yaml").chmod(0o640)
    telemetry = collector(tmp_path)
    status = await telemetry.set_enabled(True)
    assert stat.S_IMODE((tmp_path / "skulk.yaml").stat().st_mode) == 0o640
    assert status.enabled and status.consent and status.install_id
    assert (tmp_path / "skulk.yaml").read_text() == "# mine\nnode:\n  name: a\ntelemetry:\n  enabled: true\n"
    telemetry.on_stream_ended(ENDED)
    assert telemetry.status().pending == 1
    status = await telemetry.set_enabled(False)
    assert not status.enabled and status.pending == 0
    assert "enabled: false" in (tmp_path / "skulk.yaml").read_text()
    assert status.install_id  # kept: the key to ask for deletion of what was sent


async def test_the_environment_refuses_the_switch(tmp_path):
    telemetry = collector(tmp_path, enabled=True, env_disabled=True)
    assert not telemetry.status().enabled and telemetry.status().disabled_by_env
    with pytest.raises(TelemetryDisabledByEnv, match="SKULK_TELEMETRY_DISABLE"):
        await telemetry.set_enabled(True)
    assert not (tmp_path / "skulk.yaml").exists() and not (tmp_path / "telemetry_install_id").exists()
    assert not (await telemetry.set_enabled(False)).enabled  # off is always allowed


async def test_a_broken_config_is_not_overwritten(tmp_path):
    (tmp_path / "skulk.yaml").write_text("node: [\n")
    telemetry = collector(tmp_path)
    with pytest.raises(TelemetryConfigUnwritable, match="not a valid config"):
        await telemetry.set_enabled(True)
    assert (tmp_path / "skulk.yaml").read_text() == "node: [\n"
    assert not telemetry.status().enabled
