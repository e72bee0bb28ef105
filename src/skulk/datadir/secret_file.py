"""Secrets kept in the data dir (the cluster key, the node's API key): created once with a
random value, mode 0600, and read back strictly.

Creation uses O_EXCL so two processes racing on a fresh data dir cannot both write a
secret: the loser reads the winner's. A file that is empty is an error, never a silent new
secret (a node would otherwise change its key without anyone noticing). This module must
never log or print a secret.
"""

from __future__ import annotations

import logging
import os
import secrets
import stat
from pathlib import Path
from typing import Final

log = logging.getLogger(__name__)

GENERATED_SECRET_BYTES: Final = 32
"""32 random bytes (256 bits) rendered as urlsafe base64: printable and shell-safe."""


class SecretFileError(Exception):
    """A secret file that cannot be created or read, naming the file."""

    def __init__(self, message: str, *, path: Path) -> None:
        super().__init__(message)
        self.path = path


def read_secret_file(path: Path, what: str) -> str:
    """The secret in `path`, stripped; warns when group or others may read it."""
    try:
        mode = path.stat().st_mode
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SecretFileError(f"cannot read {what} file {path}: {exc}", path=path) from exc
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        log.warning("%s file %s is readable by group/others (mode %o); chmod 600 it", what, path, mode & 0o777)
    value = text.strip()
    if not value:
        raise SecretFileError(f"{what} file {path} is empty; delete it or write a key into it", path=path)
    return value


def load_or_create_secret(path: Path, what: str) -> tuple[str, bool]:
    """Read `path`, creating it with a random secret (mode 0600) when absent. Returns the
    secret and whether it was created now."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SecretFileError(f"cannot create directory {path.parent}: {exc}", path=path) from exc
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return read_secret_file(path, what), False
    except OSError as exc:
        raise SecretFileError(f"cannot create {what} file {path}: {exc}", path=path) from exc
    value = secrets.token_urlsafe(GENERATED_SECRET_BYTES)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(value + "\n")
        handle.flush()
        os.fsync(handle.fileno())
    return value, True


__all__ = ["GENERATED_SECRET_BYTES", "SecretFileError", "load_or_create_secret", "read_secret_file"]
