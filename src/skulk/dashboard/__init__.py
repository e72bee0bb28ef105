"""The operator dashboard: static ES modules, custom elements and CSS served by every node's
API at `/` (`skulk.api.routes.dashboard`). Nothing here is built or fetched at run time: no
Node toolchain, no CDN, no third-party JavaScript. The page follows `GET /v1/events`.
"""

from __future__ import annotations

from pathlib import Path

STATIC_DIR = Path(__file__).parent / "static"
"""The dashboard's files; `index.html` is the page served at `/`."""

INDEX_FILE = STATIC_DIR / "index.html"
