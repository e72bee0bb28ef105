"""The dashboard's static files: `/` is its page, `/static/...` its modules and styles.

Served without an API key (`skulk.api.auth.OPEN_PATHS`): the page asks for the key and then
calls the API with it. A build without the files (`skulk.dashboard.INDEX_FILE` missing)
serves the API alone and answers `/` with a 404 naming the cause.
"""

from __future__ import annotations

from fastapi import APIRouter, FastAPI, HTTPException
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles

from skulk.dashboard import INDEX_FILE, STATIC_DIR

router = APIRouter()


@router.get("/", include_in_schema=False)
def index() -> FileResponse:
    if not INDEX_FILE.is_file():
        raise HTTPException(404, f"this node has no dashboard assets ({INDEX_FILE} is missing)")
    return FileResponse(INDEX_FILE, media_type="text/html", headers={"Cache-Control": "no-cache"})


def mount_static(app: FastAPI) -> None:
    """Mount `/static` when the assets are present."""
    if STATIC_DIR.is_dir():
        app.mount("/static", StaticFiles(directory=STATIC_DIR), name="dashboard-static")
