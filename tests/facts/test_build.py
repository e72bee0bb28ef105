"""A node's build: the commit of the checkout it runs from, or a packager's stamp."""

from __future__ import annotations

import subprocess
from pathlib import Path

import skulk
from skulk.facts import build


def test_a_checkout_reports_its_head(monkeypatch):
    monkeypatch.delenv("SKULK_BUILD_COMMIT", raising=False)
    package = Path(skulk.__file__).resolve().parent
    head = subprocess.run(["git", "-C", str(package), "rev-parse", "--short=12", "HEAD"], capture_output=True,
                          text=True, timeout=30)
    if head.returncode != 0:
        return  # not a checkout (an installed package): nothing to compare
    commit = build._git_commit(package)
    assert commit is not None and commit.removesuffix("-dirty") == head.stdout.strip()


def test_a_stamp_wins(monkeypatch):
    monkeypatch.setenv("SKULK_BUILD_COMMIT", "cafe1234")
    build.build_commit.cache_clear()
    try:
        assert build.build_commit() == "cafe1234"
    finally:
        build.build_commit.cache_clear()


def test_no_checkout_and_no_vcs_install_is_no_commit(tmp_path):
    assert build._git_commit(tmp_path) is None
