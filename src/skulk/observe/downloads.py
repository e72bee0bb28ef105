"""Download and staging progress as an operator reads it in `/state` (`downloadProgress`):
per node and model, bytes so far and in all, the average transfer rate of the current
attempt, the time left at that rate, and how long ago the last sample arrived (a stalled
transfer shows as a growing `sampleAgeS` with no new bytes).

Only attempts State still says are pending are shown (`live_download_progress`): a late
sample of a finished or replaced attempt is never passed off as progress. Pure.
"""

from __future__ import annotations

from typing import Any

from skulk.shared.telemetry_view import TelemetryView, live_download_progress
from skulk.shared.types.state import State


def download_report(view: TelemetryView, state: State, now: float) -> dict[str, dict[str, dict[str, Any]]]:
    """`now` is the same monotonic clock the view's receipt times use."""
    report: dict[str, dict[str, dict[str, Any]]] = {}
    for node_id, models in live_download_progress(view, state).items():
        timings = view.nodes[node_id].download_timing
        for model_id, progress in models.items():
            timing = timings.get(model_id)
            rate = None
            if timing is not None and timing.attempt_id == progress.attempt_id and timing.last_at > timing.first_at:
                rate = max(progress.downloaded_bytes - timing.first_bytes, 0) / (timing.last_at - timing.first_at)
            remaining = max(progress.total_bytes - progress.downloaded_bytes, 0)
            report.setdefault(node_id, {})[model_id] = {
                "attemptId": progress.attempt_id,
                "downloadedBytes": progress.downloaded_bytes,
                "totalBytes": progress.total_bytes,
                "fraction": progress.downloaded_bytes / progress.total_bytes if progress.total_bytes else None,
                "bytesPerSecond": rate,
                "etaSeconds": remaining / rate if rate else None,
                "sampleAgeS": now - timing.last_at if timing is not None else None,
            }
    return report
