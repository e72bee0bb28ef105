"""Which build of Skulk this process runs: the package version and the source commit.

Every node reports both (`NodeResources.version` and `.commit`), so a cluster whose nodes run
different builds says so (`skulk.shared.health.version_mismatch_reason`) even while the
package version, bumped only at releases, is the same everywhere. The commit comes from the
first of:

1. `SKULK_BUILD_COMMIT` (a packager's stamp; tests set it to play two builds);
2. the git checkout the package runs from (`git rev-parse --short=12 HEAD`, with a
   deadline), plus `-dirty` when tracked files differ from it;
3. an install from a VCS URL: the `commit_id` pip records in `direct_url.json`;

and is None when none applies (a plain wheel install: the version then says it all).
"""

from __future__ import annotations

import json
import subprocess
from functools import cache
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

from skulk import __version__
from skulk.shared.settings import setting

GIT_TIMEOUT_S = 5.0
COMMIT_CHARS = 12


@cache
def build_commit() -> str | None:
    """This build's source commit (see the module doc), once per process."""
    stamped = setting("SKULK_BUILD_COMMIT")
    if stamped:
        return stamped.strip()
    return _git_commit(Path(__file__).resolve().parent) or _installed_commit()


def build_version() -> str:
    return __version__


def _git_commit(package_dir: Path) -> str | None:
    root = next((p for p in (package_dir, *package_dir.parents) if (p / ".git").exists()), None)
    if root is None:
        return None
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", f"--short={COMMIT_CHARS}", "HEAD"],
                              capture_output=True, text=True, timeout=GIT_TIMEOUT_S, check=False)
        if head.returncode != 0 or not head.stdout.strip():
            return None
        dirty = subprocess.run(["git", "-C", str(root), "diff", "--quiet", "HEAD", "--"],
                               capture_output=True, timeout=GIT_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return head.stdout.strip() + ("-dirty" if dirty.returncode == 1 else "")


def _installed_commit() -> str | None:
    try:
        text = distribution("skulk").read_text("direct_url.json")
    except PackageNotFoundError:
        return None
    if not text:
        return None
    try:
        commit = json.loads(text).get("vcs_info", {}).get("commit_id")
    except (ValueError, AttributeError):
        return None
    return commit[:COMMIT_CHARS] if isinstance(commit, str) and commit else None


__all__ = ["build_commit", "build_version"]
