"""How many CPU threads llama.cpp runs, and how its OpenMP threads wait at a barrier
(chosen before the library loads).

A CPU decode step is hundreds of parallel regions, each ending at a barrier. libgomp's
threads spin there (by default ~300k iterations) before sleeping: on a quiet machine that
shaves the wake-up latency off every barrier, but when anything else wants a core (this
node's own API and data plane included) the spinners starve the one thread holding the work
and decode collapses (measured on 2 cores: ~900 -> ~60 tok/s on the tiny model, at 8x the CPU
per token). A bounded spin keeps most of the quiet-machine speed and degrades gently under
load. An operator's own OMP_WAIT_POLICY or GOMP_SPINCOUNT always wins.

libgomp reads these once, when it initialises, so they must be in the runner's environment
before the engine library is imported; the runner process is fresh, so setting them there
affects nothing else.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, MutableMapping

DEFAULT_SPIN_COUNT = 30_000
"""Spin iterations before a waiting thread sleeps: tens of microseconds, about one small
matrix operation, so a barrier reached on time is caught spinning and a starved one is not
spun on for long."""

OPERATOR_KEYS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")


def physical_cores() -> int:
    """The CPU threads a llama.cpp engine uses by default: one per physical core (hyper-
    threads share a core's math units, and an OpenMP team larger than the cores stalls at
    every barrier)."""
    try:
        import psutil

        cores = psutil.cpu_count(logical=False)
    except Exception:  # psutil may not know on exotic platforms
        cores = None
    return max(1, cores or os.cpu_count() or 1)


def wait_policy_overrides(env: Mapping[str, str]) -> dict[str, str]:
    """The variables to add to `env`: none when the operator already chose a policy."""
    if any(env.get(key) for key in OPERATOR_KEYS):
        return {}
    return {"GOMP_SPINCOUNT": str(DEFAULT_SPIN_COUNT)}


def apply_wait_policy(env: MutableMapping[str, str]) -> dict[str, str]:
    """Set the overrides in `env` (the runner's os.environ); returns what was set."""
    overrides = wait_policy_overrides(env)
    env.update(overrides)
    return overrides


__all__ = ["DEFAULT_SPIN_COUNT", "OPERATOR_KEYS", "apply_wait_policy", "physical_cores", "wait_policy_overrides"]
