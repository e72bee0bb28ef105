from __future__ import annotations

import os
import tempfile

import pytest

# Downloads and staging keep a 10 GiB operating-system reserve by default; the tiny test
# models need a few MB, so a test machine with less than 10 GiB free would fail every
# download for a reason no test is about. Tests of the reserve set it explicitly (or pass
# `reserve_bytes`); node processes inherit this through their environment.
os.environ.setdefault("SKULK_DISK_RESERVE_GB", "0")

# A node serves GGUF with the best llama-server it finds on the machine: a managed build in
# the machine's engines dir, else the bundled one (xllamacpp). The suite's nodes serve
# in-process unless a test asks otherwise, whatever a developer has built or installed here:
# the tests of the out-of-the-box path turn the bundled server on (and name an engines dir)
# explicitly. Node processes inherit both through their environment.
os.environ.setdefault("SKULK_BUNDLED_LLAMA_SERVER", "0")
# Nor does a test node start a background native build (tests of it opt in).
os.environ.setdefault("SKULK_NO_ENGINE_AUTOPROVISION", "1")
os.environ.setdefault("SKULK_ENGINES_DIR", os.path.join(tempfile.gettempdir(), "skulk-tests-no-managed-engines"))

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
