"""Companion repos: the one download contract for artifacts a model needs besides its own.

A card may name companions (an MTP sidecar, an assistant drafter, a served engine's draft
GGUF, split vision weights). No instance names them, yet a runner of the model loads them,
so every resolution path (a fresh download, the already-on-disk fast path, store staging,
the store-unreachable direct fallback) ensures them through `ensure_companions` before the
model is reported ready, and eviction counts them as in use while such a runner lives.

- `companion_download_specs(card)` (pure) enumerates them, each flagged required or
  best-effort. Vision weights are required: the model cannot load without them. The
  sidecar, assistant and draft are best-effort: a missing drafter degrades to plain decode
  instead of blocking the model.
- `companion_card(card, spec)` (pure) describes a companion as a card, so that the hub
  download, the store's fetch route and staging take it unchanged. Only its artifact fields
  mean anything (repo, GGUF file, format); its shape fields are the base model's.
  Companions follow their repo's main branch (a card pins only its own revision).
- `ensure_companions` applies the required/best-effort policy around a resolver the caller
  supplies (the worker passes the same path it resolved the model through). Blocking: run it
  in a thread. A required failure raises `DownloadFailed` naming the companion repo.

This module never chooses a download path and never touches the disk itself.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from skulk.models.artifact_errors import ArtifactUnavailable
from skulk.models.downloads import DownloadFailed
from skulk.shared.types.cards import ModelCard
from skulk.shared.types.ids import ModelId

logger = logging.getLogger(__name__)

CompanionRole = Literal["vision", "mtp_sidecar", "assistant", "served_draft"]


@dataclass(frozen=True)
class CompanionSpec:
    role: CompanionRole
    repo_id: str
    gguf_file: str | None
    """The GGUF file within the repo; None for a safetensors repo."""
    required: bool
    """Required: the model cannot load without it, so its failure fails the resolution.
    Best-effort: its failure is logged and the model is ready without it."""


def companion_download_specs(card: ModelCard) -> tuple[CompanionSpec, ...]:
    """The card's companions, required ones first (so a doomed resolution fails before any
    best-effort transfer). Empty for a card that names none."""
    specs: list[CompanionSpec] = []
    if card.vision_weights_repo is not None:
        specs.append(CompanionSpec("vision", card.vision_weights_repo, card.vision_weights_file, True))
    if card.mtp_sidecar_repo is not None:
        specs.append(CompanionSpec("mtp_sidecar", card.mtp_sidecar_repo, None, False))
    if card.assistant_model_repo is not None:
        specs.append(CompanionSpec("assistant", card.assistant_model_repo, None, False))
    if card.served_spec_draft_repo is not None:
        specs.append(CompanionSpec("served_draft", card.served_spec_draft_repo, card.served_spec_draft_file, False))
    return tuple(specs)


def companion_repo_ids(card: ModelCard | None) -> frozenset[str]:
    """The repos a runner of `card` depends on besides the card's own."""
    return frozenset(s.repo_id for s in companion_download_specs(card)) if card is not None else frozenset()


def companions_of(cards: Callable[[], Mapping[ModelId, ModelCard]]) -> Callable[[str], frozenset[str]]:
    """For `eviction.in_use_model_ids`: a model id's companion repos, from the cards now known."""
    return lambda model_id: companion_repo_ids(cards().get(ModelId(model_id)))


_COMPANION_FIELDS = ("mtp_sidecar_repo", "assistant_model_repo", "served_spec_draft_repo", "served_spec_draft_file",
                     "vision_weights_repo", "vision_weights_file")


def companion_card(card: ModelCard, spec: CompanionSpec) -> ModelCard:
    """`spec` as a card the download paths accept: the companion's repo and file, the
    artifact format they imply (GGUF with a file, safetensors without), no revision pin, no
    companions of its own. Shape fields are copied from `card` and mean nothing."""
    data = card.model_dump(mode="python", by_alias=False, exclude=set(_COMPANION_FIELDS))
    data.update(
        model_id=spec.repo_id, name=f"{card.name} ({spec.role})", source="huggingface", source_revision=None,
        local_path=None, gguf_file=spec.gguf_file,
        placement={"compatible_backends": ("llama_cpp",) if spec.gguf_file is not None else ("mlx",)},
    )
    return ModelCard.model_validate(data)


def ensure_companions(
    card: ModelCard, resolve: Callable[[ModelCard], Path], *, log: logging.Logger = logger
) -> dict[str, Path]:
    """Resolve every companion of `card` through `resolve` (blocking). Returns the resolved
    paths by repo id. A required companion's failure raises DownloadFailed for the model,
    naming the companion; a best-effort one's is logged once here and skipped."""
    resolved: dict[str, Path] = {}
    for spec in companion_download_specs(card):
        try:
            resolved[spec.repo_id] = resolve(companion_card(card, spec))
        except Exception as exc:
            reason = exc.reason if isinstance(exc, ArtifactUnavailable) else f"{type(exc).__name__}: {exc}"
            if spec.required:
                kind = exc.kind if isinstance(exc, DownloadFailed) else "error"
                raise DownloadFailed(card.model_id, f"required companion {spec.role} repo {spec.repo_id} "
                                     f"could not be obtained: {reason}", kind) from exc
            log.warning("best-effort companion %s repo %s of %s unavailable, continuing without it: %s",
                        spec.role, spec.repo_id, card.model_id, reason)
    return resolved


__all__ = [
    "CompanionRole",
    "CompanionSpec",
    "companion_card",
    "companion_download_specs",
    "companion_repo_ids",
    "companions_of",
    "ensure_companions",
]
