"""The spans a runner records for one traced generation: queue wait (admitted until the
dispatcher starts it), prefill (until the first token), decode in batches of
DECODE_BATCH_TOKENS tokens, and its end. They leave with the task's last messages
(`messages.TraceSpans`, before the terminal frame) and are kept by the runner's node.

Only traced tasks get a `RunnerSpans`; untraced ones pay one `is None` test per token.
Called from the dispatcher's thread under the task's stream lock.
"""

from __future__ import annotations

import time

from skulk.shared.types.traces import TraceSpan

DECODE_BATCH_TOKENS = 16
"""Decode steps per span: one span per token would make a long generation's trace heavier
than its output; 16 keeps the rhythm (and any stall) visible."""


def _now_us() -> float:
    return time.time() * 1e6


class RunnerSpans:
    def __init__(self, admitted_us: float | None = None) -> None:
        self.admitted_us = _now_us() if admitted_us is None else admitted_us
        self.started_us: float | None = None
        self.batch_start_us: float | None = None
        self.batch_tokens = 0
        self.tokens = 0
        self.spans: list[TraceSpan] = []

    def _span(self, name: str, start_us: float, end_us: float, **args: str | int | float | bool | None) -> None:
        self.spans.append(TraceSpan(name=name, lane="runner", start_us=start_us, dur_us=max(end_us - start_us, 0.0),
                                    args=args))

    def started(self) -> None:
        now = _now_us()
        self.started_us = now
        self._span("runner.queue_wait", self.admitted_us, now)

    def token(self) -> None:
        now = _now_us()
        self.tokens += 1
        if self.batch_start_us is None:
            self._span("runner.prefill", self.started_us or self.admitted_us, now)
            self.batch_start_us = now
            return
        self.batch_tokens += 1
        if self.batch_tokens >= DECODE_BATCH_TOKENS:
            self._flush(now)

    def _flush(self, now: float) -> None:
        if self.batch_tokens and self.batch_start_us is not None:
            self._span("runner.decode", self.batch_start_us, now, tokens=self.batch_tokens)
        self.batch_start_us, self.batch_tokens = now, 0

    def finish(self, outcome: str) -> list[TraceSpan]:
        now = _now_us()
        self._flush(now)
        self.spans.append(TraceSpan(name="runner.finish", lane="runner", start_us=now, instant=True,
                                    args={"outcome": outcome, "tokens": self.tokens}))
        return self.spans
