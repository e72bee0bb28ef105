"""Which local paths `POST /models/add` may register, decided before anything is read.

A path is accepted only under the node's models dir or a directory the operator listed
(`models.local_dirs`), after symlinks and `..` are resolved. Outside them every path gets
the same refusal, whether it exists or not, so the route is no oracle for the node's
filesystem; inside them the route still refuses directories that are not MLX model folders
and files that are not GGUF, without listing what is there.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from skulk.api.errors import Forbidden, InvalidRequest


def _within(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def allowed_local_path(raw: str, roots: Iterable[Path]) -> Path:
    """`raw` resolved, when it lies under one of `roots`; else a typed refusal."""
    path = Path(raw)
    if not path.is_absolute():
        raise InvalidRequest(f"path {raw!r} must be absolute", param="path")
    resolved = Path(os.path.realpath(path))
    real_roots = [Path(os.path.realpath(root)) for root in roots]
    if not any(_within(resolved, root) for root in real_roots):
        raise Forbidden(
            "Local models are registered only from this node's models dir or a directory listed in "
            "models.local_dirs (skulk.yaml, or SKULK_MODELS_LOCAL_DIRS); put the model there or list its directory.",
            param="path", code="path_not_allowed",
        )
    return resolved


__all__ = ["allowed_local_path"]
