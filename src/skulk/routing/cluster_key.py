"""The cluster key: the one shared secret that admits a node to a cluster.

A cluster key is any operator string. A fresh node creates a random one in its data dir
(`cluster.key`, mode 0600); other nodes join with `--cluster-key` / `SKULK_CLUSTER_KEY`.
The key never goes on the wire: `derive_wire_key` turns it, together with the network
version, into the 32-byte AEAD key that seals every envelope.

This module must never log or print a key; `skulk cluster key` is the one place that shows it.
"""

from __future__ import annotations

import logging
import os
import secrets
import stat
from pathlib import Path
from typing import Final

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

log = logging.getLogger(__name__)

CLUSTER_KEY_FILE: Final = "cluster.key"

# 32 random bytes (256 bits) rendered as urlsafe base64: printable, shell-safe, and no
# weaker than the derived AEAD key.
GENERATED_KEY_BYTES: Final = 32

WIRE_KEY_BYTES: Final = 32

# HKDF salt: fixed and public; it separates our derivation from any other use of the same
# operator string. The info string binds the network version (see derive_wire_key).
_HKDF_SALT: Final = b"skulk/cluster-key/v1"
_HKDF_INFO_PREFIX: Final = b"skulk wire key|"


class ClusterKeyError(Exception):
    """The cluster key could not be resolved: empty, unreadable or unwritable key file."""

    def __init__(self, message: str, *, path: Path | None = None) -> None:
        super().__init__(message)
        self.path = path


def _normalise(key: str) -> str:
    # Surrounding whitespace is never part of a key: it is what `$(cat cluster.key)`, an env
    # file or a copy-paste adds.
    return key.strip()


def load_or_create_cluster_key(data_dir: str | os.PathLike[str]) -> str:
    """Read `<data_dir>/cluster.key`, creating it with a random key (mode 0600) on first start."""
    directory = Path(data_dir)
    path = directory / CLUSTER_KEY_FILE
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ClusterKeyError(f"cannot create data dir {directory}: {exc}", path=path) from exc
    try:
        # O_EXCL: two nodes racing on a fresh data dir cannot both write a key; the loser
        # reads the winner's.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return _read_key_file(path)
    except OSError as exc:
        raise ClusterKeyError(f"cannot create cluster key file {path}: {exc}", path=path) from exc
    key = secrets.token_urlsafe(GENERATED_KEY_BYTES)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(key + "\n")
        handle.flush()
        os.fsync(handle.fileno())
    log.info("created a new cluster key in %s (print it with `skulk cluster key`)", path)
    return key


def _read_key_file(path: Path) -> str:
    try:
        mode = path.stat().st_mode
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ClusterKeyError(f"cannot read cluster key file {path}: {exc}", path=path) from exc
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        log.warning("cluster key file %s is readable by group/others (mode %o); chmod 600 it", path, mode & 0o777)
    key = _normalise(text)
    if not key:
        # A truncated file must not silently become a fresh key: the node would leave its
        # cluster without anyone noticing.
        raise ClusterKeyError(f"cluster key file {path} is empty; delete it or write a key into it", path=path)
    return key


def resolve_cluster_key(explicit: str | None, data_dir: str | os.PathLike[str]) -> str:
    """The key this node uses: `explicit` (--cluster-key / SKULK_CLUSTER_KEY) wins over the data dir.

    An empty or whitespace-only `explicit` counts as not given (an unset env var often
    arrives as "").
    """
    if explicit is not None and _normalise(explicit):
        return _normalise(explicit)
    return load_or_create_cluster_key(data_dir)


def derive_wire_key(cluster_key: str, network_version: str) -> bytes:
    """HKDF-SHA256 of the cluster key into the 32-byte AEAD key for `network_version`.

    The network version is in the HKDF info, so builds with different wire versions derive
    different keys from the same cluster key and reject each other's envelopes as "auth".
    """
    key = _normalise(cluster_key)
    if not key:
        raise ClusterKeyError("cluster key is empty")
    if not network_version:
        raise ValueError("network_version is empty")
    hkdf = HKDF(
        algorithm=hashes.SHA256(),
        length=WIRE_KEY_BYTES,
        salt=_HKDF_SALT,
        info=_HKDF_INFO_PREFIX + network_version.encode("utf-8"),
    )
    return hkdf.derive(key.encode("utf-8"))
