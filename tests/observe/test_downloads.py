"""Download progress in `/state`: bytes, rate and ETA per node and model from telemetry
samples folded with their receipt times; only attempts State says are pending. Pure."""

from __future__ import annotations

import pytest

from skulk.observe.downloads import download_report
from skulk.shared.telemetry_view import TelemetryView, record
from skulk.shared.types.state import DownloadStatusCompleted, DownloadStatusPending, State
from skulk.shared.types.telemetry import DownloadProgress


def sample(done: int, attempt: str = "a1", total: int = 1000) -> DownloadProgress:
    return DownloadProgress(node_id="n1", model_id="m/x", attempt_id=attempt, downloaded_bytes=done, total_bytes=total)


def fold(samples: list[tuple[float, DownloadProgress]]) -> TelemetryView:
    view = TelemetryView()
    for at, reading in samples:
        view = record(view, "n1", reading, at)
    return view


PENDING = State(downloads={"n1": {"m/x": DownloadStatusPending(attempt_id="a1")}})


@pytest.mark.parametrize(("samples", "now", "expected"), [
    # one sample: bytes, no rate yet
    ([(10.0, sample(100))], 11.0,
     {"downloadedBytes": 100, "fraction": 0.1, "bytesPerSecond": None, "etaSeconds": None, "sampleAgeS": 1.0}),
    # 300 bytes in 2 s since the first sample: 150 B/s, 600 left -> 4 s
    ([(10.0, sample(100)), (11.0, sample(250)), (12.0, sample(400))], 12.5,
     {"downloadedBytes": 400, "fraction": 0.4, "bytesPerSecond": 150.0, "etaSeconds": 4.0, "sampleAgeS": 0.5}),
    # a new attempt restarts the rate from its own first sample
    ([(10.0, sample(900)), (20.0, sample(0, attempt="a2")), (22.0, sample(200, attempt="a2"))], 22.0, None),
    # a stalled transfer: no new bytes, a growing sample age
    ([(10.0, sample(500)), (12.0, sample(500))], 40.0,
     {"downloadedBytes": 500, "fraction": 0.5, "bytesPerSecond": 0.0, "etaSeconds": None, "sampleAgeS": 28.0}),
])
def test_rate_and_eta(samples, now, expected):
    report = download_report(fold(samples), PENDING, now)
    if expected is None:  # State's pending attempt is a1, the samples moved on to a2: not shown
        assert report == {}
        return
    entry = report["n1"]["m/x"]
    assert {k: entry[k] for k in expected} == expected
    assert entry["totalBytes"] == 1000 and entry["attemptId"] == "a1"


def test_a_completed_download_is_not_shown_as_progress():
    done = State(downloads={"n1": {"m/x": DownloadStatusCompleted(attempt_id="a1", total_bytes=1000)}})
    assert download_report(fold([(1.0, sample(999))]), done, 2.0) == {}
