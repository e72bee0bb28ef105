"""The operator dashboard: static ES modules, custom elements and CSS served by every node's
API at `/` (`skulk.api.routes.dashboard`). Nothing here is built or fetched at run time: no
Node toolchain, no CDN, no third-party JavaScript. The page follows `GET /v1/events`.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from skulk.shared.settings import setting

STATIC_DIR = Path(__file__).resolve().parent / "static"
"""The dashboard's files as the package ships them; `index.html` is the page served at `/`."""

DASHBOARD_DIR_ENV = "SKULK_DASHBOARD_DIR"
"""Serve the dashboard from this directory instead (a modified copy); doctor checks it too."""

INDEX_NAME = "index.html"


def dashboard_dir(env: Mapping[str, str]) -> Path:
    """Where this node's dashboard files are: the override, else the packaged ones. Pure."""
    return Path(setting(DASHBOARD_DIR_ENV, env)) if setting(DASHBOARD_DIR_ENV, env) else STATIC_DIR
