"""The node's memory of its authoritative model store, across restarts.

When the elected master advertises its store, a follower adopts it (`store_host.py`). That
choice is written here, in the node's data dir, so that after a restart the follower keeps
staging from the same store through the startup window instead of briefly serving as a
bootstrap store of its own (and downloading into a canonical dir nobody else uses). The
memory only fills the gap before a master is heard: a live master's answer always wins, and
an explicit `store_host` beats both.

A missing, unreadable or malformed file means "nothing remembered", never an error: the
node then bootstraps as a fresh install does. Writes are atomic (temp file + rename).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from skulk.datadir.atomic_file import write_atomic
from skulk.model_store.host import StoreAddress

logger = logging.getLogger(__name__)

STORE_MEMORY_FILE = "store-choice.json"
"""In the node's data dir: `{"host", "port", "scheme"}` of the last store the master named."""


def load_remembered_store(data_home: Path) -> StoreAddress | None:
    try:
        raw = json.loads((Path(data_home) / STORE_MEMORY_FILE).read_text(encoding="utf-8"))
        scheme = raw.get("scheme", "http")
        if scheme not in ("http", "https"):
            return None
        port = raw["port"]
        if not isinstance(port, int) or not 0 < port < 65536 or not isinstance(raw["host"], str) or not raw["host"]:
            return None
        return StoreAddress(raw["host"], port, scheme)
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        logger.warning("ignoring unreadable %s: %s", Path(data_home) / STORE_MEMORY_FILE, exc)
        return None


def remember_store(data_home: Path, address: StoreAddress) -> None:
    """Persist `address` as the authoritative store (atomically; a failure is logged, not
    raised: losing the memory costs only a bootstrap window after the next restart)."""
    path = Path(data_home) / STORE_MEMORY_FILE
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps({"host": address.host, "port": address.port, "scheme": address.scheme}))
    except OSError as exc:
        logger.warning("could not remember the model store in %s: %s", path, exc)


__all__ = ["STORE_MEMORY_FILE", "load_remembered_store", "remember_store"]
