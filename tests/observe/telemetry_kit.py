"""Shared kit for field telemetry tests: a collector over a temporary data dir, with a fake
POST that records what it was sent."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from skulk.datadir.config import TelemetrySection
from skulk.observe.field_collector import FieldTelemetry
from skulk.observe.field_telemetry import serving_hardware
from skulk.shared.types.state import State

HARDWARE = {"n1": "linux-x86_64-cpu-24gb"}


@dataclass
class FakeIngest:
    """Answers every POST with `status` (None: raises, as a POST that got no answer)."""

    status: int | None = 200
    bodies: list[dict] = field(default_factory=list)

    async def post(self, url: str, body: bytes) -> int:
        self.bodies.append({"url": url, **json.loads(body)})
        if self.status is None:
            raise ConnectionRefusedError("nobody listens")
        return self.status


def collector(tmp_path: Path, *, enabled: bool = False, env_disabled: bool = False, ingest: FakeIngest | None = None,
              state: State | None = None, builtin: frozenset[str] = frozenset({"local/tiny-llama"}),
              i_am_master: bool = True) -> FieldTelemetry:
    ingest = ingest or FakeIngest()
    return FieldTelemetry(
        TelemetrySection(enabled=enabled, endpoint="http://127.0.0.1:9/in", flush_seconds=1),
        env_disabled=env_disabled, config_file=tmp_path / "skulk.yaml",
        install_id_file=tmp_path / "telemetry_install_id", version="9.9.9", builtin_model_ids=builtin,
        hardware_of=lambda: dict(HARDWARE),
        serving_hardware=lambda ended, hardware: serving_hardware(state or State(), hardware, ended.command_id,
                                                                   ended.model_id),
        i_am_master=lambda: i_am_master, post=ingest.post,
    )
