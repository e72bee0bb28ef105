"""Engine weights on transparent huge pages: the environment a node's engine processes start with.

Decoding a token streams every weight of a model through the CPU once; with 4 KiB pages
that is a TLB miss every 4 KiB. Weights that llama.cpp copies into memory of its own (a pool
donor's whole share, received over RPC; a GPU build's host buffers; KV cache and compute
buffers everywhere) come from glibc's malloc, whose large blocks get 4 KiB pages unless
they are marked for transparent huge pages, and most distributions ship THP in "madvise"
mode (only marked memory gets them). glibc (2.35+) marks its large blocks itself when the
process starts with the tunable `glibc.malloc.hugetlb=1`; tunables are read once, at
process start, so the node exports it at its own start, before any runner or engine
server is spawned, and every engine process inherits it.

Measured (bench/pool.py, 2-core machine): a pool donor's share went from 0 to all of it on
huge pages, and pooled decode rose by 2-5%; README "llama.cpp memory pooling" has the figures.

Off with SKULK_HUGEPAGES=0. An operator's own `glibc.malloc.hugetlb` setting is kept as is;
other tunables already in GLIBC_TUNABLES are kept beside ours. Elsewhere than glibc (macOS)
the variable means nothing and is harmless.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping

HUGEPAGES_ENV = "SKULK_HUGEPAGES"
"""'0' leaves engine processes' malloc on its default pages."""
TUNABLES_ENV = "GLIBC_TUNABLES"
HUGETLB_TUNABLE = "glibc.malloc.hugetlb"
HUGEPAGE_MALLOC = f"{HUGETLB_TUNABLE}=1"
"""1: glibc marks its large blocks MADV_HUGEPAGE (2 would demand reserved hugetlbfs pages)."""


def hugepages_wanted(env: Mapping[str, str]) -> bool:
    return env.get(HUGEPAGES_ENV, "1").strip() != "0"


def tunables_with_hugepages(current: str | None) -> str:
    """GLIBC_TUNABLES with huge-page malloc added: colon-separated name=value pairs, an
    existing `glibc.malloc.hugetlb` (the operator's choice) left alone."""
    pairs = [pair for pair in (current or "").split(":") if pair.strip()]
    if any(pair.split("=", 1)[0].strip() == HUGETLB_TUNABLE for pair in pairs):
        return ":".join(pairs)
    return ":".join([*pairs, HUGEPAGE_MALLOC])


def export_hugepage_malloc(env: MutableMapping[str, str]) -> bool:
    """At node start (before any child process): put huge-page malloc into `env` unless
    SKULK_HUGEPAGES=0; whether it is on for the engine processes."""
    if not hugepages_wanted(env):
        return False
    env[TUNABLES_ENV] = tunables_with_hugepages(env.get(TUNABLES_ENV))
    return True


__all__ = [
    "HUGEPAGES_ENV",
    "HUGEPAGE_MALLOC",
    "TUNABLES_ENV",
    "export_hugepage_malloc",
    "hugepages_wanted",
    "tunables_with_hugepages",
]
