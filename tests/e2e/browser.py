"""A headless Chromium for dashboard tests (Debian's `/usr/bin/chromium`, driven by
Playwright for Python), with every request the page makes recorded, and screenshots written
as test artefacts under `SKULK_ARTIFACTS_DIR` (default `test-artifacts/`)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest

CHROMIUM_PATHS = ("/usr/bin/chromium", "/usr/bin/chromium-browser")
ARTIFACTS_ENV = "SKULK_ARTIFACTS_DIR"

UI_TIMEOUT_MS = 60_000
"""Longest wait for one thing to appear on the page: a hang guard on a noisy 2-core machine."""


def chromium_path() -> str:
    found = next((p for p in CHROMIUM_PATHS if Path(p).exists()), None) or shutil.which("chromium")
    if found is None:
        pytest.skip("Debian's chromium is not installed (apt-get install chromium; .ci/run does)")
    return found


def artifacts_dir(name: str) -> Path:
    directory = Path(os.environ.get(ARTIFACTS_ENV, "test-artifacts")) / name
    directory.mkdir(parents=True, exist_ok=True)
    return directory


@dataclass
class BrowserPage:
    page: object
    requests: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    shots: Path | None = None

    def shot(self, name: str) -> Path:
        path = self.shots / f"{name}.png"
        self.page.screenshot(path=str(path), full_page=True)
        return path


@contextmanager
def open_page(artifacts: str, *, width: int = 1280, height: int = 900,
              args: tuple[str, ...] = ()) -> Iterator[BrowserPage]:
    """One headless page; closed (with its browser) however the test ends. `args`: more
    Chromium switches (a fake microphone, say)."""
    from playwright.sync_api import expect, sync_playwright

    executable = chromium_path()
    expect.set_options(timeout=UI_TIMEOUT_MS)  # assertions, like actions, wait this long
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, args=["--no-sandbox", *args])
        try:
            page = browser.new_page(viewport={"width": width, "height": height})
            page.set_default_timeout(UI_TIMEOUT_MS)
            recorded = BrowserPage(page=page, shots=artifacts_dir(artifacts))
            page.on("request", lambda request: recorded.requests.append(request.url))
            page.on("pageerror", lambda error: recorded.errors.append(str(error)))
            yield recorded
        finally:
            browser.close()
