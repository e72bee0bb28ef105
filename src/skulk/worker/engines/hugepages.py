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

The in-process llama.cpp engine goes one step further (`weights_in_malloc`): where huge-page
malloc is in effect it loads its weights with read() into llama.cpp's own buffers instead of
mmap()ing the GGUF, because a file mapping gets huge pages only where the page cache happens
to hold large aligned folios (measured: 127 of 190 MiB of a driver's share, 235 of 373 MiB
of a whole model), while malloc'd weights get them throughout. It also makes the weights
honest anonymous memory: a mapped GGUF counts as reclaimable page cache in "available".

Measured (bench/pool.py and one-node A/B, 2-core machine, interleaved requests): a pool
donor's share on huge pages, +2-5% pooled decode; weights read into huge pages instead of
mapped, +12-22% one-node decode and +7-10% pooled. README "llama.cpp memory pooling" has the
figures.

Off with SKULK_HUGEPAGES=0 (engines then also map their weights, as before). An operator's
own `glibc.malloc.hugetlb` setting is kept as is; other tunables already in GLIBC_TUNABLES
are kept beside ours. Elsewhere than glibc (macOS) the variable means nothing and is
harmless.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping, MutableMapping
from pathlib import Path

from skulk.shared.settings import setting

HUGEPAGES_ENV = "SKULK_HUGEPAGES"
"""'0' leaves engine processes' malloc on its default pages."""
TUNABLES_ENV = "GLIBC_TUNABLES"
HUGETLB_TUNABLE = "glibc.malloc.hugetlb"
HUGEPAGE_MALLOC = f"{HUGETLB_TUNABLE}=1"
"""1: glibc marks its large blocks MADV_HUGEPAGE (2 would demand reserved hugetlbfs pages)."""


def hugepages_wanted(env: Mapping[str, str]) -> bool:
    return setting(HUGEPAGES_ENV, env) != "0"


def _hugetlb_setting(tunables: str | None) -> str | None:
    """The value of `glibc.malloc.hugetlb` in a GLIBC_TUNABLES string (colon-separated
    name=value pairs), None when it is not set there."""
    for pair in (tunables or "").split(":"):
        name, _, value = pair.partition("=")
        if name.strip() == HUGETLB_TUNABLE:
            return value.strip()
    return None


def tunables_with_hugepages(current: str | None) -> str:
    """GLIBC_TUNABLES with huge-page malloc added, an existing `glibc.malloc.hugetlb` (the
    operator's choice) left alone."""
    pairs = [pair for pair in (current or "").split(":") if pair.strip()]
    if _hugetlb_setting(current) is not None:
        return ":".join(pairs)
    return ":".join([*pairs, HUGEPAGE_MALLOC])


THP_ENABLED_FILE = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def thp_mode(path: Path = THP_ENABLED_FILE) -> str | None:
    """The kernel's transparent huge page mode ("always", "madvise", "never"), None where
    there is none (not Linux, or no THP)."""
    try:
        found = re.search(r"\[(\w+)\]", path.read_text())
    except OSError:
        return None
    return found.group(1) if found else None


def hugepage_malloc_in_effect(tunables: str | None) -> bool:
    """Whether this process was started with glibc's huge-page malloc (1 or 2)."""
    return _hugetlb_setting(tunables) in ("1", "2")


def weights_in_malloc(platform: str, tunables: str | None, mode: str | None, wanted: bool = True) -> bool:
    """Load llama.cpp weights with read() rather than mmap(): on Linux, where malloc'd
    memory gets transparent huge pages (THP "always", or "madvise" with huge-page malloc in
    effect), unless SKULK_HUGEPAGES=0 (`wanted` False). Elsewhere mmap stays (macOS shares
    mapped weights with the GPU; a kernel without THP gains nothing from the copy)."""
    if not wanted or not platform.startswith("linux"):
        return False
    return mode == "always" or (mode == "madvise" and hugepage_malloc_in_effect(tunables))


def this_process_weights_in_malloc(env: Mapping[str, str]) -> bool:
    """`weights_in_malloc` for the running process (an engine's load)."""
    return weights_in_malloc(sys.platform, env.get(TUNABLES_ENV), thp_mode(), hugepages_wanted(env))


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
    "THP_ENABLED_FILE",
    "TUNABLES_ENV",
    "export_hugepage_malloc",
    "hugepage_malloc_in_effect",
    "hugepages_wanted",
    "this_process_weights_in_malloc",
    "thp_mode",
    "tunables_with_hugepages",
    "weights_in_malloc",
]
