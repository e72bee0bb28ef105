"""Where a model's files come from and what a failure means: the pure artifact plan (tables)."""

from __future__ import annotations

from pathlib import Path

import pytest

from skulk.artifacts.plan import (
    ArtifactFailure,
    FailDownload,
    FailureCooldown,
    FallBackToHub,
    Route,
    after_staging_failure,
    live_failures,
    local_path_of,
    route_for,
    staged_dir,
)
from skulk.models.cards import builtin_cards_dir, load_card
from skulk.shared.types.cards import ModelCard
from tests.mockhub import hub_card

GENERATED = load_card(builtin_cards_dir() / "local--tiny-llama-gguf.toml")
GENERATED_HF = load_card(builtin_cards_dir() / "local--tiny-llama.toml")


def _local(gguf_file: str | None) -> ModelCard:
    base = GENERATED if gguf_file else GENERATED_HF
    return ModelCard.model_validate({**base.model_dump(by_alias=False), "model_id": "local/mine",
                                     "source": "local-path", "local_path": "/weights", "gguf_file": gguf_file})


@pytest.mark.parametrize(
    ("card", "store_bound", "route"),
    [
        (GENERATED, False, Route.GENERATE),
        (GENERATED, True, Route.GENERATE),  # a generated model never goes through the store
        (_local("m.gguf"), True, Route.LOCAL_PATH),
        (hub_card("org/m"), False, Route.HUB),
        (hub_card("org/m"), True, Route.STORE),
    ],
)
def test_route_for(card, store_bound, route) -> None:  # type: ignore[no-untyped-def]
    assert route_for(card, store_bound) is route


def test_local_path_of_joins_the_gguf_file() -> None:
    assert local_path_of(_local("m.gguf")) == Path("/weights/m.gguf")
    assert local_path_of(_local(None)) == Path("/weights")


@pytest.mark.parametrize(
    ("staging_kind", "decision"),
    [
        ("unreachable", FallBackToHub()),
        ("not_found", FailDownload("not_found")),
        ("disk", FailDownload("disk")),
        ("deadline", FailDownload("deadline")),
        ("cancelled", FailDownload("cancelled")),
        ("transfer", FailDownload("transient")),
        ("size_mismatch", FailDownload("transient")),
        ("invalid", FailDownload("error")),
        ("something_new", FailDownload("error")),
    ],
)
def test_after_staging_failure(staging_kind, decision) -> None:  # type: ignore[no-untyped-def]
    assert after_staging_failure(staging_kind) == decision


@pytest.mark.parametrize(
    ("kind", "retry_at"),
    [("transient", 160.0), ("deadline", 160.0), ("cancelled", 160.0), ("disk", 160.0),
     ("not_found", None), ("unauthorized", None), ("error", None), (None, None)],
)
def test_failure_cooldown(kind, retry_at) -> None:  # type: ignore[no-untyped-def]
    assert FailureCooldown(cooldown_s=60.0).retry_at(kind, 100.0) == retry_at


def test_live_failures_drop_the_expired_and_keep_the_permanent() -> None:
    failures = {"a": ArtifactFailure("net", 10.0), "b": ArtifactFailure("404"), "c": ArtifactFailure("net", 20.0)}
    assert live_failures(failures, 9.9) == failures
    assert live_failures(failures, 10.0) == {"b": failures["b"], "c": failures["c"]}
    assert live_failures(failures, 1e9) == {"b": failures["b"]}


@pytest.mark.parametrize(
    ("path", "expected"),
    [("/s/m--x/model.gguf", "/s/m--x"), ("/s/m--x", "/s/m--x"), ("/s", None), ("/models/m/model.gguf", None)],
)
def test_staged_dir(path, expected) -> None:  # type: ignore[no-untyped-def]
    found = staged_dir(Path(path), Path("/s"))
    assert found == (Path(expected) if expected else None)
