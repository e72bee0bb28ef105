"""Getting a model's files without a node around it: for `skulk models pull`, the tests and
the benchmarks. Blocking; the node's worker runs the same routes (`plan.route_for`) with the
cluster's events and the model store around them (`skulk.worker.downloads`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from skulk.artifacts.plan import Route, local_path_of, route_for
from skulk.models.artifact_errors import ArtifactUnavailable
from skulk.models.companions import ensure_companions
from skulk.models.downloads import ProgressCallback, download_model
from skulk.models.tiny_models import ensure_generated
from skulk.shared.types.cards import ModelCard


def resolve_local_path(card: ModelCard) -> Path:
    """A local-path card's files, which must exist on this node."""
    path = local_path_of(card)
    if not path.exists():
        raise ArtifactUnavailable(card.model_id, f"{path} does not exist on this node")
    return path


def ensure_local_model(
    card: ModelCard, models_dir: Path, *, on_progress: ProgressCallback | None = None
) -> Path:
    """The path an engine loads for `card` (an HF folder for MLX, a .gguf for llama.cpp),
    with no model store: generated, checked in place, or downloaded into `models_dir`
    (HF_ENDPOINT and HF_TOKEN honoured; a complete copy already there is reused). Failures
    raise ArtifactUnavailable (DownloadFailed for the hub)."""
    route = route_for(card, store_bound=False)
    if route is Route.GENERATE:
        return ensure_generated(card, models_dir)
    if route is Route.LOCAL_PATH:
        return resolve_local_path(card)
    return download_model(card, models_dir, on_progress=on_progress)


@dataclass(frozen=True)
class Pulled:
    path: Path
    companions: dict[str, Path] = field(default_factory=dict)
    """Companion repos resolved with the model (repo id -> path)."""


def pull_model(
    card: ModelCard,
    models_dir: Path,
    *,
    progress_for: Callable[[ModelCard], ProgressCallback | None] = lambda _card: None,
    reserve_bytes: int | None = None,
    cancel: threading.Event | None = None,
) -> Pulled:
    """`skulk models pull`: the model's files and, for a hub model, its companion repos the
    way the worker gets them (a required one failing fails the pull). `progress_for` gives
    each repo its progress callback (the CLI's bar per repo)."""
    if route_for(card, store_bound=False) is not Route.HUB:
        return Pulled(ensure_local_model(card, models_dir))

    def pull(which: ModelCard) -> Path:
        return download_model(which, models_dir, on_progress=progress_for(which), reserve_bytes=reserve_bytes,
                              cancel=cancel)

    path = pull(card)
    return Pulled(path, ensure_companions(card, pull))


__all__ = ["Pulled", "ensure_local_model", "pull_model", "resolve_local_path"]
