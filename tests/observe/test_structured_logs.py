"""Structured logs: the JSON fields of a record, the config's refusal of an ingest URL that
could not work, and the shipper against a real loopback HTTP collector (batches arrive; a
dead collector or a full queue drops lines, counted, without blocking the caller)."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from skulk.datadir.config import ConfigError, parse_config
from skulk.observe.structured_logs import IngestShipper, log_fields, request_ids
from tests.nodeproc import free_port, wait_for


class Collector:
    """A loopback HTTP server that keeps every POSTed body's lines."""

    def __init__(self) -> None:
        self.lines: list[dict] = []
        self.posts = 0
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["content-length"]))
                collector.posts += 1
                collector.lines.extend(json.loads(line) for line in body.decode().splitlines() if line)
                self.send_response(204)
                self.end_headers()

            def log_message(self, *_args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/insert/jsonline"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def collector() -> Iterator[Collector]:
    c = Collector()
    yield c
    c.close()


def record(message: str = "hello %s", *args, **extra) -> logging.LogRecord:
    rec = logging.LogRecord("skulk.test", logging.INFO, __file__, 1, message, args or ("world",), None)
    for key, value in extra.items():
        setattr(rec, key, value)
    return rec


def test_fields_carry_node_and_request_ids():
    plain = log_fields(record(), "n1", "one")
    assert plain["_msg"] == "hello world" and plain["nodeId"] == "n1" and plain["nodeName"] == "one"
    assert plain["level"] == "INFO" and plain["_time"].endswith("+00:00") and "commandId" not in plain
    with request_ids(commandId="c1", traceId="c1"):
        inside = log_fields(record(task_id="t9"), "n1", "one")
    assert (inside["commandId"], inside["traceId"], inside["taskId"]) == ("c1", "c1", "t9")
    assert "commandId" not in log_fields(record(), "n1", "one")


@pytest.mark.parametrize(("yaml", "problem"), [
    ("logging: {enabled: true, ingest_url: 'http://x:9428/insert/jsonline'}", None),
    ("logging: {enabled: true}", None),
    ("logging: {ingest_url: 'http://x:9428'}", "set logging.enabled: true"),
    ("logging: {enabled: true, ingest_url: 'x:9428'}", "http:// or https://"),
])
def test_config_refuses_an_ingest_url_that_could_not_work(yaml, problem):
    if problem is None:
        parse_config(yaml, Path("skulk.yaml"))
        return
    with pytest.raises(ConfigError, match=problem):
        parse_config(yaml, Path("skulk.yaml"))


def test_the_shipper_sends_batches_to_the_collector(collector):
    shipper = IngestShipper(collector.url, "n1", "one", batch_lines=4, flush_s=0.2)
    try:
        for n in range(10):
            shipper.emit(record("line %s", n))
        wait_for(lambda: len(collector.lines) == 10, timeout_s=20, what="ten lines shipped")
    finally:
        shipper.close()
    assert [line["_msg"] for line in collector.lines] == [f"line {n}" for n in range(10)]
    assert collector.posts >= 3 and all(line["nodeId"] == "n1" for line in collector.lines)
    assert shipper.stats()["sentLines"] == 10 and shipper.dropped == 0


def test_a_dead_collector_or_a_full_queue_never_blocks_the_caller():
    shipper = IngestShipper(f"http://127.0.0.1:{free_port()}/", "n1", "one", capacity=5, batch_lines=2,
                            flush_s=0.1, post_timeout_s=0.5)
    try:
        for n in range(200):
            shipper.emit(record("line %s", n))  # put_nowait: a blocking emit would hang here
        wait_for(lambda: shipper.failed_batches >= 1, timeout_s=20, what="a failed batch counted")
    finally:
        shipper.close()
    assert shipper.dropped >= 200 - 5 - 2  # only what fits the queue (and one batch in hand) waited
    assert shipper.sent_lines == 0


def test_a_node_with_structured_logs_prints_json_lines_and_ships_them(spawn_node, tmp_path, collector):
    data_dir = tmp_path / "jsonlog"
    data_dir.mkdir()
    (data_dir / "skulk.yaml").write_text(f"logging:\n  enabled: true\n  ingest_url: {collector.url}\n")
    node = spawn_node("jsonlog", data_dir=data_dir)
    node.wait_ready()
    node_id = node.get("/node_id").json()["nodeId"]

    def shipped_startup():
        return any(line["nodeId"] == node_id and " up; data " in line["_msg"] for line in collector.lines)

    wait_for(shipped_startup, timeout_s=30, what="the startup line at the collector")
    printed = [json.loads(line) for line in node.log().splitlines() if line.startswith("{")]
    assert any(line["nodeId"] == node_id and line["level"] == "INFO" for line in printed)
    shipping = node.get("/v1/diagnostics/node").json()["logShipping"]
    assert shipping["url"] == collector.url and shipping["sentLines"] >= 1 and shipping["dropped"] == 0
