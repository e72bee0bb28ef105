"""`read_cluster()`'s snapshot, built from State and the telemetry plane."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from skulk.extensions.cluster_view import accelerator_vendor, cluster_view, liveness_of
from skulk.shared.telemetry_view import NODE_TIMEOUT_S, TelemetryView, record
from skulk.shared.types.ids import NodeId
from skulk.shared.types.state import NodeInfo, State
from skulk.shared.types.telemetry import DiskReading, GpuReading, MemoryReading, NodeResources

NOW_UTC = datetime(2026, 1, 1, tzinfo=UTC)


def _resources(
    node: str, *, backends: list[str] | None = None, gpus: list[GpuReading] | None = None, tags: list[str] | None = None
) -> NodeResources:
    return NodeResources(
        node_id=NodeId(node),
        node_name=node,
        version="9.9.9",
        memory=MemoryReading(ram_total_bytes=1, ram_available_bytes=1),
        disk=DiskReading(models_dir="/m", total_bytes=1, free_bytes=1),
        backends=backends or [],
        gpus=gpus or [],
        capability_tags=tags or [],
    )


NVIDIA = GpuReading(vendor="nvidia", index=0, name="H100", vram_total_bytes=1, vram_free_bytes=1)


@pytest.mark.parametrize(
    ("resources", "vendor"),
    [
        (None, None),
        (_resources("a"), None),
        (_resources("a", backends=["llama_cpp-cpu", "mlx-cpu"]), None),
        (_resources("a", backends=["mlx", "mlx-cpu"]), "apple"),
        (_resources("a", gpus=[NVIDIA]), "nvidia"),
    ],
)
def test_accelerator_vendor(resources: NodeResources | None, vendor: str | None) -> None:
    assert accelerator_vendor(resources) == vendor


@pytest.mark.parametrize(("age", "liveness"), [(None, "unknown"), (0.0, "alive"), (NODE_TIMEOUT_S, "stale")])
def test_liveness(age: float | None, liveness: str) -> None:
    assert liveness_of(age) == liveness


def test_members_with_role_tags_and_liveness() -> None:
    state = State(
        nodes={
            NodeId("a"): NodeInfo(node_id=NodeId("a"), node_name="alpha", version="1.0"),
            NodeId("b"): NodeInfo(node_id=NodeId("b"), node_name="beta", version="1.0"),
        }
    )
    view = record(
        TelemetryView(),
        NodeId("b"),
        _resources("b", backends=["llama_cpp"], gpus=[NVIDIA], tags=["rag", "stt@1.0.0"]),
        received_at=100.0,
    )
    a, b = cluster_view(state, view, master_id="a", self_id="b", now=101.0, now_utc=NOW_UTC)
    assert (a.node_id, a.role, a.liveness, a.capabilities, a.version, a.is_self) == (
        "a",
        "master",
        "unknown",
        (),
        "1.0",
        False,
    )
    assert (b.role, b.liveness, b.backends, b.accelerator_vendor, b.capabilities, b.version, b.is_self) == (
        "member",
        "alive",
        ("llama_cpp",),
        "nvidia",
        ("rag", "stt@1.0.0"),
        "9.9.9",
        True,
    )
