"""The cluster key: the one shared secret that admits a node to a cluster.

A cluster key is any operator string. A fresh node creates a random one in its data dir
(`cluster.key`, mode 0600); other nodes join with `--cluster-key` / `SKULK_CLUSTER_KEY`.
The key never goes on the wire: `derive_wire_key` turns it, together with the network
version, into the 32-byte AEAD key that seals every envelope.

This module must never log or print a key; `skulk cluster key` is the one place that shows it.
"""

from __future__ import annotations

import base64
import logging
import os
from pathlib import Path
from typing import Final

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from skulk.datadir.secret_file import GENERATED_SECRET_BYTES, SecretFileError, load_or_create_secret, read_secret_file

log = logging.getLogger(__name__)

CLUSTER_KEY_FILE: Final = "cluster.key"

# 32 random bytes (256 bits) rendered as urlsafe base64: printable, shell-safe, and no
# weaker than the derived AEAD key.
GENERATED_KEY_BYTES: Final = GENERATED_SECRET_BYTES

WIRE_KEY_BYTES: Final = 32

# HKDF salt: fixed and public; it separates our derivation from any other use of the same
# operator string. The info string binds the network version (see derive_wire_key).
_HKDF_SALT: Final = b"skulk/cluster-key/v1"
_HKDF_INFO_PREFIX: Final = b"skulk wire key|"
_PEER_TOKEN_INFO: Final = b"skulk peer http token|v1"


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
    path = Path(data_dir) / CLUSTER_KEY_FILE
    try:
        key, created = load_or_create_secret(path, "cluster key")
    except SecretFileError as exc:
        raise ClusterKeyError(str(exc), path=exc.path) from None
    if created:
        log.info("created a new cluster key in %s (print it with `skulk cluster key`)", path)
    return key


def read_cluster_key_file(path: str | os.PathLike[str]) -> str:
    """The key in an operator's key file (`--cluster-key-file`): never created here."""
    try:
        return read_secret_file(Path(path), "cluster key")
    except SecretFileError as exc:
        raise ClusterKeyError(str(exc), path=exc.path) from None


def resolve_cluster_key(
    explicit: str | None, data_dir: str | os.PathLike[str], key_file: str | os.PathLike[str] | None = None
) -> str:
    """The key this node uses: `explicit` (--cluster-key / SKULK_CLUSTER_KEY) wins over
    `key_file` (--cluster-key-file / SKULK_CLUSTER_KEY_FILE), which wins over the data dir.

    An empty or whitespace-only `explicit` counts as not given (an unset env var often
    arrives as "").
    """
    if explicit is not None and _normalise(explicit):
        return _normalise(explicit)
    if key_file:
        return read_cluster_key_file(key_file)
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


def derive_peer_token(cluster_key: str) -> str:
    """The credential nodes of one cluster present to each other's HTTP APIs (store
    artifacts, API probes, diagnostics): HKDF-SHA256 of the cluster key under its own info
    string, so it reveals nothing of the key or of the wire key. It carries the operator
    role (`skulk.api.access`)."""
    key = _normalise(cluster_key)
    if not key:
        raise ClusterKeyError("cluster key is empty")
    hkdf = HKDF(algorithm=hashes.SHA256(), length=32, salt=_HKDF_SALT, info=_PEER_TOKEN_INFO)
    return "skulk-peer-" + base64.urlsafe_b64encode(hkdf.derive(key.encode("utf-8"))).decode("ascii").rstrip("=")
