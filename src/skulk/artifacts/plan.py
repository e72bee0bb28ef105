"""Where a model's files come from, and what to do when getting them fails: pure decisions.

Resolving a card to a path on disk used to be decided three times (the tiny-model module,
the worker, the `skulk models pull` command), and the worker kept the rest of the policy in
its async code: a store it cannot reach falls back to the hub, a staging failure becomes a
download failure of some kind, a passing failure is forgotten after a `sleep`. Every one of
those decisions is here, over plain data, with table tests (`tests/artifacts/`); the shells
(`skulk.artifacts.resolve` for blocking callers, `skulk.worker.downloads` for the node) only
carry them out.

- `route_for(card, store_bound)`: generate, check a local path, download from the hub, or
  stage through the model store.
- `after_staging_failure(kind)`: a store this node cannot reach at all -> fall back to the
  hub; any other staging failure -> a download failure of the matching kind.
- `FailureCooldown`: which download failure kinds clear on their own and after how long a node
  may try again (the back-off, as data), and `live_failures` to drop the expired ones.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from skulk.models.downloads import FailureKind as DownloadFailureKind
from skulk.shared.types.cards import ModelCard


class Route(StrEnum):
    """How this node gets a card's files."""

    GENERATE = "generate"
    """`local-generated`: the project's tiny model, written on first use (`tiny_models`)."""
    LOCAL_PATH = "local-path"
    """`local-path`: the operator's files, used in place; they must exist."""
    HUB = "hub"
    """`huggingface` with no model store bound: download into this node's models dir."""
    STORE = "store"
    """`huggingface` with a model store bound: stage a copy through the store (which fetches
    from the hub once for the whole cluster)."""


def route_for(card: ModelCard, store_bound: bool) -> Route:
    """The one switch on a card's source."""
    if card.source == "local-generated":
        return Route.GENERATE
    if card.source == "local-path":
        return Route.LOCAL_PATH
    return Route.STORE if store_bound else Route.HUB


def local_path_of(card: ModelCard) -> Path:
    """A local-path card's file or folder: `local_path`, joined with `gguf_file` (or
    `onnx_file`) when set."""
    assert card.local_path is not None  # the card validator requires it for local-path
    path = Path(card.local_path)
    named = card.gguf_file if card.gguf_file is not None else card.onnx_file
    return path / named if named is not None else path


# -- a staging through the store that failed ----------------------------------------------------


@dataclass(frozen=True)
class FallBackToHub:
    """The store did not answer this node at all: download from the hub directly instead
    (expected for a remote member with no route to the home store)."""


@dataclass(frozen=True)
class FailDownload:
    """Fail the model's download with this kind (what the retry policy reads)."""

    kind: DownloadFailureKind


STAGING_FAILURE_KINDS: Mapping[str, DownloadFailureKind] = {
    "not_found": "not_found", "disk": "disk", "deadline": "deadline", "cancelled": "cancelled",
    "transfer": "transient", "size_mismatch": "transient", "unreachable": "transient", "invalid": "error",
}
"""A failed store staging as a download failure kind."""


def after_staging_failure(kind: str) -> FallBackToHub | FailDownload:
    if kind == "unreachable":
        return FallBackToHub()
    return FailDownload(STAGING_FAILURE_KINDS.get(kind, "error"))


def staging_failure_reason(reason: str) -> str:
    return f"staging from the model store failed: {reason}"


# -- retry back-off --------------------------------------------------------------------------


DOWNLOAD_FAILURE_COOLDOWN_S = 60.0
"""How long a passing download failure keeps failing this node's runners of that model
before the next placement may try the download again (bounds retry traffic to the hub)."""

RETRYABLE_DOWNLOAD_FAILURES: frozenset[str] = frozenset({"transient", "deadline", "cancelled", "disk"})
"""DownloadFailed kinds that can clear on their own; 404 and 401/403 need an operator."""


@dataclass(frozen=True)
class FailureCooldown:
    cooldown_s: float = DOWNLOAD_FAILURE_COOLDOWN_S
    retryable: frozenset[str] = RETRYABLE_DOWNLOAD_FAILURES

    def retry_at(self, kind: str | None, now: float) -> float | None:
        """When a failure of `kind` stops counting (None: it stays until an operator acts)."""
        return now + self.cooldown_s if kind in self.retryable else None


@dataclass(frozen=True)
class ArtifactFailure:
    """Why a model's files could not be obtained on this node, and until when that holds."""

    reason: str
    retry_at: float | None = None


def live_failures(failures: Mapping[str, ArtifactFailure], now: float) -> dict[str, ArtifactFailure]:
    """The failures that still hold at `now` (a passing one is forgotten once its time is up,
    so the next placement downloads again instead of failing on a stale reason)."""
    return {m: f for m, f in failures.items() if f.retry_at is None or now < f.retry_at}


# -- staged copies ---------------------------------------------------------------------------


def staged_dir(path: Path, staging_root: Path) -> Path | None:
    """The staged copy directory `path` lies in (or is), or None when it is not staged."""
    try:
        relative = Path(path).relative_to(staging_root)
    except ValueError:
        return None
    return staging_root / relative.parts[0] if relative.parts else None


__all__ = [
    "DOWNLOAD_FAILURE_COOLDOWN_S",
    "RETRYABLE_DOWNLOAD_FAILURES",
    "STAGING_FAILURE_KINDS",
    "ArtifactFailure",
    "FailDownload",
    "FailureCooldown",
    "FallBackToHub",
    "Route",
    "after_staging_failure",
    "live_failures",
    "local_path_of",
    "route_for",
    "staged_dir",
    "staging_failure_reason",
]
