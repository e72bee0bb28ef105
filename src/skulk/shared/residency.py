"""Residency: when an idle runner unloads its model, and what Ollama's `keep_alive` means.

A placement may set `idleTtl` (seconds, default off): once the runner has had nothing to
do for that long it closes its engine (weights and KV leave memory) but stays up, still
`Ready`; the next request reloads the model and then runs, waiting rather than failing.
An Ollama request's `keep_alive` overrides the placement's TTL from that request on, as
Ollama's does for its own model: a duration ("5m", 300), 0 (unload as soon as idle) or a
negative value (never unload).

Pure: values in, decisions out. The runner (`bootstrap.Runner`) keeps the clock.
"""

from __future__ import annotations

import math
import re
from typing import Any

_UNIT_S = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")


class KeepAliveInvalid(ValueError):
    """A `keep_alive` that is neither a number of seconds nor a Go-style duration."""


def parse_keep_alive(value: Any) -> float | None:
    """Seconds to stay loaded once idle: None when not given, -1.0 for any negative value
    (never unload), else the duration. Numbers are seconds (as Ollama takes them);
    strings are Go durations ("5m", "1h30m", "90s", "-1")."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise KeepAliveInvalid(f"keep_alive must be a duration or a number of seconds, got {value!r}")
    if isinstance(value, int | float):
        seconds = float(value)
    else:
        text = str(value).strip().lower()
        try:
            seconds = float(text)
        except ValueError:
            sign = -1.0 if text.startswith("-") else 1.0
            body = text.lstrip("+-")
            parts = _PART.findall(body)
            if not body or "".join(n + u for n, u in parts) != body:
                raise KeepAliveInvalid(
                    f"keep_alive must be a duration ('5m', '1h30m') or a number of seconds, got {value!r}") from None
            seconds = sign * sum(float(n) * _UNIT_S[u] for n, u in parts)
    if math.isnan(seconds):
        raise KeepAliveInvalid("keep_alive must be a number, not NaN")
    if math.isinf(seconds):
        raise KeepAliveInvalid("keep_alive must be finite; a negative value keeps the model loaded")
    return -1.0 if seconds < 0 else seconds


def idle_ttl(placement_ttl_s: float | None, keep_alive_s: float | None) -> float | None:
    """The TTL in force: the latest request's keep_alive when one was given, else the
    placement's `idleTtl`; None (or a negative keep_alive) keeps the model loaded."""
    ttl = keep_alive_s if keep_alive_s is not None else placement_ttl_s
    return None if ttl is None or ttl < 0 else ttl


def unload_due(ttl_s: float | None, loaded: bool, busy: bool, idle_for_s: float) -> bool:
    """Unload now: a TTL is in force, the model is loaded, nothing runs or waits, and the
    runner has been idle at least that long."""
    return ttl_s is not None and loaded and not busy and idle_for_s >= ttl_s


def idle_check_in_s(ttl_s: float | None, loaded: bool, busy: bool, idle_for_s: float, *,
                    busy_recheck_s: float) -> float | None:
    """How long the runner may wait for a message before it must check for an idle unload:
    None when no TTL is in force or nothing is loaded (only a message can change that);
    `busy_recheck_s` while something runs (the last task may end at any moment); else the
    time left until the TTL runs out (0.0: the unload is due now)."""
    if ttl_s is None or not loaded:
        return None
    if busy:
        return busy_recheck_s
    return max(0.0, ttl_s - idle_for_s)


__all__ = ["KeepAliveInvalid", "idle_check_in_s", "idle_ttl", "parse_keep_alive", "unload_due"]
