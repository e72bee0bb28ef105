"""Huge-page malloc for engine processes: the GLIBC_TUNABLES arithmetic and when weights are
read rather than mapped (tables), and that glibc really backs a large block with transparent
huge pages in a process started with it."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from skulk.worker.engines.hugepages import (
    HUGEPAGE_MALLOC,
    export_hugepage_malloc,
    hugepage_malloc_in_effect,
    hugepages_wanted,
    thp_mode,
    tunables_with_hugepages,
    weights_in_malloc,
)


@pytest.mark.parametrize(("current", "expected"), [
    (None, "glibc.malloc.hugetlb=1"),
    ("", "glibc.malloc.hugetlb=1"),
    ("glibc.malloc.arena_max=2", "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1"),
    ("glibc.malloc.hugetlb=0", "glibc.malloc.hugetlb=0"),  # the operator's own choice stays
    ("glibc.malloc.hugetlb=2:glibc.malloc.arena_max=2", "glibc.malloc.hugetlb=2:glibc.malloc.arena_max=2"),
    ("glibc.malloc.arena_max=2::", "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1"),
])
def test_tunables_with_hugepages(current: str | None, expected: str) -> None:
    assert tunables_with_hugepages(current) == expected


@pytest.mark.parametrize(("env", "wanted"), [
    ({}, True), ({"SKULK_HUGEPAGES": "1"}, True), ({"SKULK_HUGEPAGES": "0"}, False), ({"SKULK_HUGEPAGES": " 0 "}, False),
])
def test_hugepages_wanted(env: dict[str, str], wanted: bool) -> None:
    assert hugepages_wanted(env) is wanted


def test_export_sets_or_leaves_the_environment() -> None:
    env: dict[str, str] = {"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}
    assert export_hugepage_malloc(env) is True
    assert env["GLIBC_TUNABLES"] == f"glibc.malloc.arena_max=2:{HUGEPAGE_MALLOC}"
    off: dict[str, str] = {"SKULK_HUGEPAGES": "0"}
    assert export_hugepage_malloc(off) is False
    assert "GLIBC_TUNABLES" not in off


ALLOCATE_AND_REPORT = """
import re
block = bytearray(64 << 20)  # a large block: glibc mmaps it
for i in range(0, len(block), 4096):
    block[i] = 1  # touch every page
smaps = open("/proc/self/smaps_rollup").read()
print(re.search(r"AnonHugePages:\\s+(\\d+) kB", smaps).group(1))
"""


def _huge_kb(env: dict[str, str]) -> int:
    out = subprocess.run([sys.executable, "-c", ALLOCATE_AND_REPORT], env=env, capture_output=True, text=True,
                         timeout=60, check=True)
    return int(out.stdout.strip())


def _glibc_with_hugepage_malloc() -> bool:
    import platform

    name, version = platform.libc_ver()
    if name != "glibc":
        return False
    return tuple(int(part) for part in version.split(".")[:2]) >= (2, 35)  # glibc.malloc.hugetlb arrived in 2.35


def _thp_fault_fallbacks() -> int:
    try:
        found = re.search(r"^thp_fault_fallback (\d+)$", Path("/proc/vmstat").read_text(), re.MULTILINE)
    except OSError:
        return 0
    return int(found.group(1)) if found else 0


@pytest.mark.skipif(thp_mode() not in ("madvise", "always"), reason="this kernel offers no transparent huge pages")
@pytest.mark.skipif(not _glibc_with_hugepage_malloc(), reason="this C library has no huge-page malloc (glibc 2.35+)")
def test_a_process_started_with_it_gets_huge_pages_for_large_blocks() -> None:
    import os

    env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
    exported = dict(env)
    assert export_hugepage_malloc(exported)
    fallbacks = _thp_fault_fallbacks()
    with_it = _huge_kb(exported)
    if with_it == 0 and _thp_fault_fallbacks() > fallbacks:
        pytest.skip("the kernel tried and had no free huge page to give (memory fragmented)")
    assert with_it > 0, "a touched 64 MiB block got no huge page"
    if thp_mode() == "madvise":  # the default pages without the tunable: the reason it exists
        assert _huge_kb(env) < with_it


@pytest.mark.parametrize(("tunables", "in_effect"), [
    (None, False), ("", False), ("glibc.malloc.hugetlb=1", True), ("glibc.malloc.hugetlb=2", True),
    ("glibc.malloc.hugetlb=0", False), ("glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1", True),
    ("glibc.malloc.arena_max=1", False),
])
def test_hugepage_malloc_in_effect(tunables: str | None, in_effect: bool) -> None:
    assert hugepage_malloc_in_effect(tunables) is in_effect


@pytest.mark.parametrize(("platform", "tunables", "mode", "read"), [
    ("linux", HUGEPAGE_MALLOC, "madvise", True),  # a node's engine on a stock kernel
    ("linux", None, "madvise", False),  # SKULK_HUGEPAGES=0: malloc'd weights would get 4 KiB pages
    ("linux", None, "always", True),
    ("linux", HUGEPAGE_MALLOC, "never", False),
    ("linux", HUGEPAGE_MALLOC, None, False),  # no THP in this kernel
    ("darwin", HUGEPAGE_MALLOC, None, False),  # macOS maps weights for the GPU
])
def test_weights_in_malloc(platform: str, tunables: str | None, mode: str | None, read: bool) -> None:
    assert weights_in_malloc(platform, tunables, mode) is read
    assert weights_in_malloc(platform, tunables, mode, wanted=False) is False  # SKULK_HUGEPAGES=0: mapped


@pytest.mark.parametrize(("text", "mode"), [
    ("always [madvise] never\n", "madvise"), ("[always] madvise never\n", "always"), ("always madvise [never]", "never"),
])
def test_thp_mode_read(tmp_path: Path, text: str, mode: str) -> None:
    path = tmp_path / "enabled"
    path.write_text(text)
    assert thp_mode(path) == mode
    assert thp_mode(tmp_path / "absent") is None
