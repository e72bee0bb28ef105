"""`GET/PUT /v1/diagnostics/log-level`: the node's log level read and changed at run time;
a level that does not exist is refused (FastAPI's 422, naming the field) and changes nothing; an API outside a node says
it has none (409)."""

from __future__ import annotations

import logging

import pytest
from fastapi.testclient import TestClient

from skulk.api.app import create_app
from skulk.api.context import ApiContext, LogLevelControl
from skulk.shared.types.state import State


@pytest.fixture
def restore_root_level():
    level = logging.getLogger().level
    yield
    logging.getLogger().setLevel(level)


def _client(control: LogLevelControl | None) -> TestClient:
    return TestClient(create_app(ApiContext(node_id="a", node_name="a", get_state=State, log_level=control)))


def test_the_level_is_read_and_set(restore_root_level):
    client = _client(LogLevelControl())
    assert client.put("/v1/diagnostics/log-level", json={"level": "DEBUG"}).json() == {"level": "DEBUG"}
    assert logging.getLogger().level == logging.DEBUG
    assert client.get("/v1/diagnostics/log-level").json() == {"level": "DEBUG"}


@pytest.mark.parametrize("body", [{"level": "TRACE"}, {"level": 10}, {}, {"level": "INFO", "extra": 1}])
def test_a_bad_level_changes_nothing(restore_root_level, body):
    logging.getLogger().setLevel(logging.WARNING)
    response = _client(LogLevelControl()).put("/v1/diagnostics/log-level", json=body)
    assert response.status_code == 422, response.text
    assert response.json()["detail"][0]["loc"][:2] == ["body", "extra" if "extra" in body else "level"]
    assert logging.getLogger().level == logging.WARNING


def test_outside_a_node_there_is_no_level():
    response = _client(None).get("/v1/diagnostics/log-level")
    assert response.status_code == 409 and response.json()["code"] == "no_log_level"
