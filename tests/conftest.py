from __future__ import annotations

import os

import pytest

# Downloads and staging keep a 10 GiB operating-system reserve by default; the tiny test
# models need a few MB, so a test machine with less than 10 GiB free would fail every
# download for a reason no test is about. Tests of the reserve set it explicitly (or pass
# `reserve_bytes`); node processes inherit this through their environment.
os.environ.setdefault("SKULK_DISK_RESERVE_GB", "0")

from tests.nodeproc import PORT_TRIES, NodeProcess, free_port


@pytest.fixture
def spawn_node(tmp_path):
    """Factory for real node processes; every one is stopped at teardown, pass or fail."""
    started: list[NodeProcess] = []

    def spawn(name: str = "node", *, data_dir=None, extra_args=(), env=None, port=None, **options) -> NodeProcess:
        node = NodeProcess(
            data_dir=data_dir or tmp_path / name,
            api_port=port or free_port(),
            port_tries=options.pop("port_tries", PORT_TRIES if port is None else 1),
            extra_args=list(extra_args),
            env=dict(env or {}),
            **options,
        )
        started.append(node)
        return node.start()

    yield spawn
    for node in started:
        node.stop()
