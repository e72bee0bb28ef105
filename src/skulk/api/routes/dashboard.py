"""The dashboard's static files: `/` is its page, `/static/...` its modules and styles.

Served without an API key (`skulk.api.auth.OPEN_PATHS`): the page asks for the key and then
calls the API with it. The directory is `skulk.dashboard.dashboard_dir` (the packaged files,
or `SKULK_DASHBOARD_DIR`); without an `index.html` there the node serves the API alone and
`/` is a 404 naming the cause (doctor warns about it too).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from fastapi import FastAPI, HTTPException
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles

from skulk.dashboard import INDEX_NAME, dashboard_dir


def mount(app: FastAPI, env: Mapping[str, str] = os.environ) -> None:
    """Add `/` and, when the files are present, `/static`."""
    directory = dashboard_dir(env)
    index_file = directory / INDEX_NAME

    @app.get("/", include_in_schema=False)
    def index() -> FileResponse:
        if not index_file.is_file():
            raise HTTPException(404, f"this node has no dashboard files ({index_file} is missing); see `skulk doctor`")
        return FileResponse(index_file, media_type="text/html", headers={"Cache-Control": "no-cache"})

    if Path(directory).is_dir():
        app.mount("/static", StaticFiles(directory=directory), name="dashboard-static")
