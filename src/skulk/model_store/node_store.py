"""This node's view of the model store: where canonical and staged copies live, what the
store has registered, the eviction policy from skulk.yaml, and `stage_model`, the one call
that turns a model id into a staged directory whichever node hosts the store.

`NodeStore` is plain data the node builds once (`node_store`) and hands to the API's store
routes and the worker, so neither reads config or paths itself. It holds no policy of its
own: eviction decisions are `eviction.py`'s, store choice is `store_host.py`'s, and
assembling copies is `staging.py`'s. A registered copy is a complete download (its
`skulk-download.json` marker, written by `downloads.py`) in the store host's models dir.
"""

from __future__ import annotations

import shutil
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from skulk.datadir.config import ModelStoreSection
from skulk.datadir.paths import SkulkPaths
from skulk.model_store.eviction import EvictionPolicy
from skulk.model_store.host import StoreAddress, StoreChoice, advertised_store, choose_store
from skulk.model_store.staging import (
    ProgressCallback,
    RetryPolicy,
    StagingFailed,
    StagingOptions,
    StoreClient,
    disk_free_bytes,
    is_safe_relative,
    manifest_from_marker,
    stage_from_local,
    stage_from_remote,
    staging_root_for,
)
from skulk.models.downloads import DownloadMarker, downloaded_models, read_marker


def disk_total_bytes(path: Path) -> int:
    probe = Path(path)
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return shutil.disk_usage(probe).total


@dataclass(frozen=True)
class NodeStore:
    staging_root: Path
    """This node's staged copies (per node, under its data dir)."""
    canonical_root: Path | None
    """The models dir holding the canonical copies when this node hosts the store; None
    on a node that only stages. Never evicted."""
    policy: EvictionPolicy = EvictionPolicy()
    free_bytes: Callable[[Path], int] = field(default=disk_free_bytes)
    total_bytes: Callable[[Path], int] | None = field(default=disk_total_bytes)


def eviction_policy(section: ModelStoreSection) -> EvictionPolicy:
    return EvictionPolicy.from_gb(section.cleanup_on_deactivate, section.staging_keep_recent_gb,
                                  section.disk_reserve_gb)


def node_store(paths: SkulkPaths, section: ModelStoreSection, hosts_store: bool) -> NodeStore:
    """The node's store roots and policy; `hosts_store` from `store_host.choose_store`."""
    return NodeStore(
        staging_root=staging_root_for(paths.data_home),
        canonical_root=paths.models_dir if hosts_store else None,
        policy=eviction_policy(section),
    )


@dataclass(frozen=True)
class StoreBinding:
    """Which store this node uses right now, and its own roots under that choice."""

    store: NodeStore
    choice: StoreChoice


def bind_store(
    paths: SkulkPaths,
    section: ModelStoreSection,
    *,
    explicit: StoreAddress | None,
    master_endpoint: str | None,
    own: StoreAddress | None,
    own_hosts: frozenset[str] = frozenset(),
    remembered: StoreAddress | None = None,
) -> StoreBinding | None:
    """The store choice and this node's roots under it, from what the node knows now (its
    explicit `store_host`, the elected master's advertised API endpoint, its own API
    address). Pure: the node re-runs it whenever the master (or its endpoint) changes.

    A node without an API (`own` None) cannot host the store: it binds to an explicit,
    advertised or remembered store, and to none at all otherwise (the worker then downloads
    directly). `remembered`: the master's store persisted before a restart (see
    `store_host.choose_store`)."""
    master_store = advertised_store(master_endpoint)
    if own is None:
        for source, address in (("explicit", explicit), ("master", master_store), ("remembered", remembered)):
            if address is not None:
                return StoreBinding(node_store(paths, section, hosts_store=False),
                                    StoreChoice(address, source, False))  # type: ignore[arg-type]
        return None
    choice = choose_store(explicit, master_store, own, own_hosts, remembered)
    return StoreBinding(node_store(paths, section, hosts_store=choice.is_self), choice)


@dataclass(frozen=True)
class BindingChange:
    """What a fresh store choice asks of the node's shell, decided purely."""

    remember: StoreAddress | None = None
    """Persist this address (`store_host.remember_store`): the master named a store other
    than the one last written, and a restart should find it before a master speaks."""
    announce: str | None = None
    """Log this line: the choice differs from the last one the node used."""


def binding_change(choice: StoreChoice | None, last: StoreChoice | None,
                   last_written: StoreAddress | None) -> BindingChange:
    """The effects of re-binding to `choice` after `last` (what the node used) and
    `last_written` (what it last persisted). Pure: the node applies the answer."""
    remember = choice.address if choice is not None and choice.source == "master" and choice.address != last_written \
        else None
    announce = None
    if choice != last:
        if choice is None:
            announce = "model store: none (no API and no store to follow); downloads go straight to the hub"
        else:
            announce = (f"model store: {choice.address.base_url} ({choice.source})"
                        + ("; this node hosts it" if choice.is_self else ""))
    return BindingChange(remember, announce)


# ---------------------------------------------------------------------------------------
# What the store has registered (read side, used by the store routes and local staging)
# ---------------------------------------------------------------------------------------


def registered(canonical_root: Path) -> list[DownloadMarker]:
    return [m for markers in downloaded_models(canonical_root).values() for m in markers]


def find_registered(canonical_root: Path, model_id: str, revision: str | None) -> DownloadMarker | None:
    """The registered copy a staging asks for: the pinned directory for a revision (or the
    main copy when it happens to be that commit); the main copy without one."""
    markers = downloaded_models(canonical_root).get(model_id, [])
    if revision is None:
        return next((m for m in markers if not m.pinned), None)
    return next((m for m in sorted(markers, key=lambda m: not m.pinned) if m.revision == revision), None)


def registered_file(canonical_root: Path, dir_name: str, file_path: str) -> Path | None:
    """The file to serve, or None when no registered manifest lists it."""
    if not dir_name or dir_name.startswith(".") or "/" in dir_name or not is_safe_relative(file_path):
        return None
    model_dir = canonical_root / dir_name
    marker = read_marker(model_dir)
    if marker is None or file_path not in marker.files:
        return None
    if manifest_from_marker(marker).dir_name != dir_name:
        return None
    path = model_dir / file_path
    try:
        path.resolve().relative_to(model_dir.resolve())
    except ValueError:
        return None  # a symlink pointing outside the model directory
    return path if path.is_file() else None


# ---------------------------------------------------------------------------------------
# Staging, whichever node hosts the store
# ---------------------------------------------------------------------------------------


def stage_model(
    store: NodeStore,
    choice: StoreChoice,
    model_id: str,
    *,
    revision: str | None = None,
    in_use_model_ids: frozenset[str] = frozenset(),
    api_key: str | None = None,
    retry: RetryPolicy = RetryPolicy(),
    cancel: threading.Event | None = None,
    on_progress: ProgressCallback | None = None,
) -> Path:
    """The staged directory of `model_id` (at `revision` when pinned): hardlinked from the
    canonical copy when this node hosts the store, transferred from the store otherwise
    (reporting `on_progress(staged_bytes, total_bytes)` as bytes arrive).
    Blocking: call it from a thread. Raises StagingFailed; kind `unreachable` is the cue for
    the caller's direct-download fallback, `not_found` for asking the store to fetch it."""
    options = StagingOptions(policy=store.policy, in_use_model_ids=in_use_model_ids,
                             canonical_root=store.canonical_root, free_bytes=store.free_bytes)
    if choice.is_self:
        if store.canonical_root is None:
            raise StagingFailed(model_id, "this node is the store host but has no canonical models dir", "invalid")
        marker = find_registered(store.canonical_root, model_id, revision)
        if marker is None:
            raise StagingFailed(model_id, "the store has no registered copy", "not_found")
        manifest = manifest_from_marker(marker)
        return stage_from_local(store.canonical_root / manifest.dir_name, manifest, store.staging_root, options)
    with StoreClient(choice.address.base_url, api_key=api_key) as client:
        return stage_from_remote(client, model_id, store.staging_root, options, revision=revision, retry=retry,
                                 cancel=cancel, on_progress=on_progress)


__all__ = [
    "BindingChange",
    "NodeStore",
    "StoreBinding",
    "bind_store",
    "binding_change",
    "disk_total_bytes",
    "eviction_policy",
    "find_registered",
    "node_store",
    "registered",
    "registered_file",
    "stage_model",
]
