"""Which browser origins may call the API (CORS), and the middleware that answers them.

Like Ollama, a node answers web pages served from the same machine by default: any scheme
of `localhost`, `127.0.0.1`, `[::1]` or `0.0.0.0`, on any port. Other origins (a web UI on
another machine of the LAN, say) are allowed only when listed in `api.cors_origins` of
`skulk.yaml` or `SKULK_CORS_ORIGINS` (comma-separated, read by `skulk.datadir.config`); `*`
allows every origin.

Starlette's maintained `CORSMiddleware` does the protocol. It must wrap everything else
(`create_app` adds it last), so that a preflight `OPTIONS` is answered before the API-key
check, which a browser's preflight can never pass (it carries no credentials), and so that
errors (a 401 included) carry the headers a page needs to read them.
"""

from __future__ import annotations

from collections.abc import Iterable

from fastapi import FastAPI
from starlette.middleware.cors import CORSMiddleware

LOCAL_ORIGIN_REGEX = r"^[a-z][a-z0-9+.-]*://(localhost|127\.0\.0\.1|\[::1\]|0\.0\.0\.0)(:\d+)?$"
"""Origins of pages served from this machine, any scheme and port: allowed by default."""

PREFLIGHT_MAX_AGE_S = 600
"""How long a browser may cache a preflight answer."""


def install_cors(app: FastAPI, extra_origins: Iterable[str] = ()) -> None:
    """Add the CORS middleware to `app`. Call it after every other middleware."""
    origins = [origin.rstrip("/") for origin in extra_origins]
    app.add_middleware(
        CORSMiddleware,
        allow_origins=["*"] if "*" in origins else origins,
        allow_origin_regex=LOCAL_ORIGIN_REGEX,
        allow_methods=["*"],
        allow_headers=["*"],
        expose_headers=["*"],
        max_age=PREFLIGHT_MAX_AGE_S,
    )


__all__ = ["LOCAL_ORIGIN_REGEX", "PREFLIGHT_MAX_AGE_S", "install_cors"]
