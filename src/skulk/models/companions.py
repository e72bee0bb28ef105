"""Companion repos: the one download contract for artifacts a model needs besides its own.

A card may name companions (a draft model: a GGUF file or, for an MLX card, a whole
safetensors repo; split vision weights). No
instance names them, yet a runner of the model loads them,
so every resolution path (a fresh download, the already-on-disk fast path, store staging,
the store-unreachable direct fallback) ensures them through `ensure_companions` before the
model is reported ready, and eviction counts them as in use while such a runner lives.

- `companion_download_specs(card)` (pure) enumerates the ones a runner will load. Each is
  required: vision weights because the model cannot load without them, the draft because a
  card that asks for draft speculation (`runtime.speculative = "draft"`) must not be served
  without it silently. A draft the card names but does not use is never downloaded.
- `draft_model_path(card, resolved)` (pure): the draft (GGUF file or MLX model directory) a
  runner of `card` loads.
- `projector_path(card, resolved, model_path)` (pure): the multimodal projector (mmproj
  GGUF) a runner of a vision card loads: the `vision_weights_file` companion of a hub
  card, or the generated file beside a local-generated card's model
  (`tiny_models.generated_projector_path`).
- `companion_card(card, spec)` (pure) describes a companion as a card, so that the hub
  download, the store's fetch route and staging take it unchanged. Only its artifact fields
  mean anything (repo, GGUF file, format); its shape fields are the base model's.
  Companions follow their repo's main branch (a card pins only its own revision).
- `ensure_companions` resolves them through a resolver the caller supplies (the worker
  passes the same path it resolved the model through). Blocking: run it in a thread. A
  failure raises `DownloadFailed` naming the companion repo.

This module never chooses a download path and never touches the disk itself.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from skulk.models.artifact_errors import ArtifactUnavailable
from skulk.models.downloads import DownloadFailed
from skulk.models.tiny_models import generated_projector_path
from skulk.shared.types.cards import ModelCard
from skulk.shared.types.ids import ModelId

CompanionRole = Literal["vision", "served_draft"]


@dataclass(frozen=True)
class CompanionSpec:
    role: CompanionRole
    repo_id: str
    gguf_file: str | None
    """The GGUF file within the repo; None for a safetensors repo."""


def companion_download_specs(card: ModelCard) -> tuple[CompanionSpec, ...]:
    """The companions a runner of `card` loads. Empty for a card that names none, and
    without the draft when the card does not speculate with it."""
    specs: list[CompanionSpec] = []
    if card.vision_weights_repo is not None:
        specs.append(CompanionSpec("vision", card.vision_weights_repo, card.vision_weights_file))
    if card.served_spec_draft_repo is not None and card.runtime.speculative == "draft":
        specs.append(CompanionSpec("served_draft", card.served_spec_draft_repo, card.served_spec_draft_file))
    return tuple(specs)


def draft_model_path(card: ModelCard, resolved: Mapping[str, str]) -> str | None:
    """The draft (GGUF file or MLX directory) a runner of `card` loads (`resolved`: companion repo id -> local path,
    as `ensure_companions` returned them), or None when the card does not draft with one or
    its draft is not resolved (the engine then refuses to load rather than serve the card
    without the speculation it asks for)."""
    if card.runtime.speculative != "draft" or card.served_spec_draft_repo is None:
        return None
    return resolved.get(card.served_spec_draft_repo)


def projector_path(card: ModelCard, resolved: Mapping[str, str], model_path: str) -> str | None:
    """The projector (mmproj GGUF) a runner of `card` loads, or None when the card does not
    see images or its projector is not resolved (an engine then refuses to load the vision
    card by name rather than serve it blind). A hub card's projector is its
    `vision_weights_repo` companion (`resolved`: companion repo id -> local path); a
    local-generated card's is the file the generator wrote beside `model_path`."""
    if "vision" not in card.capabilities:
        return None
    if card.vision_weights_repo is not None:
        return resolved.get(card.vision_weights_repo)
    if card.source == "local-generated" and card.is_gguf:
        return str(generated_projector_path(Path(model_path)))
    return None


def companion_repo_ids(card: ModelCard | None) -> frozenset[str]:
    """The repos a runner of `card` depends on besides the card's own."""
    return frozenset(s.repo_id for s in companion_download_specs(card)) if card is not None else frozenset()


def companions_of(cards: Callable[[], Mapping[ModelId, ModelCard]]) -> Callable[[str], frozenset[str]]:
    """For `eviction.in_use_model_ids`: a model id's companion repos, from the cards now known."""
    return lambda model_id: companion_repo_ids(cards().get(ModelId(model_id)))


_COMPANION_FIELDS = ("served_spec_draft_repo", "served_spec_draft_file", "served_spec_draft_size_bytes",
                     "vision_weights_repo", "vision_weights_file", "vision_weights_size_bytes")


def companion_card(card: ModelCard, spec: CompanionSpec) -> ModelCard:
    """`spec` as a card the download paths accept: the companion's repo and file, the
    artifact format they imply (GGUF with a file, safetensors without), no revision pin, no
    companions of its own. Shape fields are copied from `card` and mean nothing."""
    data = card.model_dump(mode="python", by_alias=False, exclude=set(_COMPANION_FIELDS))
    data.update(
        model_id=spec.repo_id, name=f"{card.name} ({spec.role})", source="huggingface", source_revision=None,
        local_path=None, gguf_file=spec.gguf_file,
        placement={"compatible_backends": ("llama_cpp",) if spec.gguf_file is not None else ("mlx",)}, runtime={},
    )
    return ModelCard.model_validate(data)


def ensure_companions(card: ModelCard, resolve: Callable[[ModelCard], Path]) -> dict[str, Path]:
    """Resolve every companion of `card` through `resolve` (blocking). Returns the resolved
    paths by repo id. A failure raises DownloadFailed for the model, naming the companion."""
    resolved: dict[str, Path] = {}
    for spec in companion_download_specs(card):
        try:
            resolved[spec.repo_id] = resolve(companion_card(card, spec))
        except Exception as exc:
            reason = exc.reason if isinstance(exc, ArtifactUnavailable) else f"{type(exc).__name__}: {exc}"
            kind = exc.kind if isinstance(exc, DownloadFailed) else "error"
            raise DownloadFailed(card.model_id, f"companion {spec.role} repo {spec.repo_id} "
                                 f"could not be obtained: {reason}", kind) from exc
    return resolved


__all__ = [
    "CompanionRole",
    "CompanionSpec",
    "companion_card",
    "companion_download_specs",
    "companion_repo_ids",
    "companions_of",
    "draft_model_path",
    "ensure_companions",
    "projector_path",
]
