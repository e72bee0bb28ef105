"""Structured logs (`logging.enabled` in skulk.yaml): every log record also leaves as one JSON
line on stdout, with the node's id and name and, inside a request, its command id and (when
traced) trace id, so a log search can follow one request across nodes. The human-readable
lines stay on stderr.

With `logging.ingest_url`, the same lines are shipped in batches by HTTP POST (newline-
delimited JSON, the shape VictoriaLogs' `/insert/jsonline` and Vector's HTTP source take).
Shipping never blocks serving: a record is queued with `put_nowait` into a bounded queue
(full: the record is dropped and counted), and one daemon thread sends batches of at most
INGEST_BATCH_LINES, each POST bounded by INGEST_POST_TIMEOUT_S; a failed batch is dropped
and counted, never retried into a growing backlog.

The field names follow VictoriaLogs' conventions: `_time` (RFC 3339) and `_msg`.
"""

from __future__ import annotations

import contextvars
import json
import logging
import queue
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any, TextIO

import httpx

from skulk.datadir.config import LoggingSection

INGEST_QUEUE_LINES = 10_000
"""Lines waiting to be shipped; past this, new lines are dropped (counted), never waited for."""

INGEST_BATCH_LINES = 500
"""Most lines in one POST."""

INGEST_FLUSH_S = 2.0
"""A partial batch is sent after this long: logs reach the collector within seconds."""

INGEST_POST_TIMEOUT_S = 5.0
"""Deadline of one POST; a collector slower than this loses that batch (counted)."""

INGEST_STOP_S = 1.0
"""At shutdown the shipper gets this long to send what is queued (the node's whole stop
must fit the contract's 10 s; what is left is lost, the thread is a daemon)."""

_request_ids: contextvars.ContextVar[Mapping[str, str] | None] = contextvars.ContextVar("skulk_log_ids", default=None)


def bind_request_ids(**ids: str | None) -> None:
    """Attach ids (commandId, traceId, taskId) to every log record of the current request
    (the asyncio task and what it spawns). Cheap: one context variable."""
    current = dict(_request_ids.get() or {})
    current.update({k: v for k, v in ids.items() if v})
    _request_ids.set(current)


@contextmanager
def request_ids(**ids: str | None) -> Iterator[None]:
    token = _request_ids.set({k: v for k, v in ids.items() if v})
    try:
        yield
    finally:
        _request_ids.reset(token)


def log_fields(record: logging.LogRecord, node_id: str, node_name: str) -> dict[str, Any]:
    """The JSON fields of one record. Ids passed as `extra={"task_id": ...}` (or
    command_id, trace_id) win over the request's bound ones. Pure apart from the record."""
    fields: dict[str, Any] = {
        "_time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
        "_msg": record.getMessage(),
        "level": record.levelname,
        "logger": record.name,
        "nodeId": node_id,
        "nodeName": node_name,
    }
    fields.update(_request_ids.get() or {})
    for attribute, key in (("command_id", "commandId"), ("trace_id", "traceId"), ("task_id", "taskId")):
        value = getattr(record, attribute, None)
        if isinstance(value, str):
            fields[key] = value
    if record.exc_info:
        fields["exception"] = logging.Formatter().formatException(record.exc_info)
    return fields


class JsonFormatter(logging.Formatter):
    def __init__(self, node_id: str, node_name: str) -> None:
        super().__init__()
        self.node_id = node_id
        self.node_name = node_name

    def format(self, record: logging.LogRecord) -> str:
        return json.dumps(log_fields(record, self.node_id, self.node_name), default=str)


def json_stdout_handler(node_id: str, node_name: str, stream: TextIO | None = None) -> logging.Handler:
    handler = logging.StreamHandler(stream or sys.stdout)
    handler.setFormatter(JsonFormatter(node_id, node_name))
    return handler


def structured_log_handlers(
    section: LoggingSection, node_id: str, node_name: str
) -> tuple[list[logging.Handler], IngestShipper | None]:
    """The handlers `skulk.yaml`'s `logging` section asks for (`enabled`: JSON lines on
    stdout; `ingest_url`: also shipped), and the shipper for its diagnostics."""
    if not section.enabled:
        return [], None
    handlers: list[logging.Handler] = [json_stdout_handler(node_id, node_name)]
    shipper = IngestShipper(section.ingest_url, node_id, node_name) if section.ingest_url else None
    if shipper is not None:
        handlers.append(shipper)
    return handlers, shipper


class IngestShipper(logging.Handler):
    """Ships JSON log lines to `url` in bounded batches from one daemon thread."""

    def __init__(self, url: str, node_id: str, node_name: str, *, capacity: int = INGEST_QUEUE_LINES,
                 batch_lines: int = INGEST_BATCH_LINES, flush_s: float = INGEST_FLUSH_S,
                 post_timeout_s: float = INGEST_POST_TIMEOUT_S) -> None:
        super().__init__()
        self.url = url
        self.setFormatter(JsonFormatter(node_id, node_name))
        self._queue: queue.Queue[str] = queue.Queue(maxsize=capacity)
        self._batch_lines = batch_lines
        self._flush_s = flush_s
        self._post_timeout_s = post_timeout_s
        self._stopping = threading.Event()
        self.dropped = 0
        self.sent_lines = 0
        self.failed_batches = 0
        self._thread = threading.Thread(target=self._run, name="log-shipper", daemon=True)
        self._thread.start()

    def emit(self, record: logging.LogRecord) -> None:
        if record.name.startswith("httpx"):
            return  # our own POSTs' log lines would feed the shipper forever
        try:
            self._queue.put_nowait(self.format(record))
        except queue.Full:
            self.dropped += 1
        except Exception:
            self.handleError(record)

    def _take_batch(self) -> list[str]:
        batch: list[str] = []
        deadline = time.monotonic() + self._flush_s
        while len(batch) < self._batch_lines:
            left = deadline - time.monotonic()
            if left <= 0 or (self._stopping.is_set() and self._queue.empty()):
                break
            try:
                batch.append(self._queue.get(timeout=min(left, 0.2)))
            except queue.Empty:
                continue
        return batch

    def _run(self) -> None:
        with httpx.Client(timeout=self._post_timeout_s) as client:
            while not (self._stopping.is_set() and self._queue.empty()):
                batch = self._take_batch()
                if not batch:
                    continue
                try:
                    response = client.post(self.url, content=("\n".join(batch) + "\n").encode(),
                                           headers={"content-type": "application/x-ndjson"})
                    ok = response.status_code < 300
                except httpx.HTTPError:
                    ok = False
                if ok:
                    self.sent_lines += len(batch)
                else:
                    self.failed_batches += 1

    def close(self) -> None:
        self._stopping.set()
        self._thread.join(timeout=INGEST_STOP_S)
        super().close()

    def stats(self) -> dict[str, Any]:
        return {"url": self.url, "queued": self._queue.qsize(), "capacity": self._queue.maxsize,
                "dropped": self.dropped, "sentLines": self.sent_lines, "failedBatches": self.failed_batches}
