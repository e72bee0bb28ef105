from __future__ import annotations

import pytest

from tests.nodeproc import NodeProcess, free_port


@pytest.fixture
def spawn_node(tmp_path):
    """Factory for real node processes; every one is stopped at teardown, pass or fail."""
    started: list[NodeProcess] = []

    def spawn(name: str = "node", *, data_dir=None, extra_args=(), env=None, port=None, **options) -> NodeProcess:
        node = NodeProcess(
            data_dir=data_dir or tmp_path / name,
            api_port=port or free_port(),
            extra_args=list(extra_args),
            env=dict(env or {}),
            **options,
        )
        started.append(node)
        return node.start()

    yield spawn
    for node in started:
        node.stop()
