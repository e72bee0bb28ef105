"""Companion repos: the card fields, the one enumeration (`companion_download_specs`: the
draft only for a card that drafts with it), the fields that were removed, failures naming
the companion, and eviction counting companions of live runners as in use."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from skulk.model_store.eviction import in_use_model_ids
from skulk.model_store.staging import StagingOptions, remove_staged, stage_from_local
from skulk.models.cards import builtin_cards_dir, load_card
from skulk.models.companions import (
    CompanionSpec,
    companion_card,
    companion_download_specs,
    companion_repo_ids,
    companions_of,
    draft_model_path,
    ensure_companions,
    projector_path,
)
from skulk.models.downloads import DownloadFailed
from skulk.shared.types.cards import ModelCard
from skulk.shared.types.state import State
from tests.mockhub import GGUF_FILE, TINY_GGUF_REPO, TINY_MLX_REPO, hub_card
from tests.worker.tiny_gguf import NODE, tiny_instance

VISION, DRAFT = "acme/vision", "acme/draft-GGUF"
DRAFTING = {"served_spec_draft_repo": DRAFT, "served_spec_draft_file": "d-Q4_0.gguf",
            "served_spec_draft_size_bytes": 1_000_000, "runtime": {"speculative": "draft"}}


def card_with(**companions) -> ModelCard:
    base = hub_card(TINY_GGUF_REPO, gguf_file=GGUF_FILE)
    return ModelCard.model_validate({**base.model_dump(by_alias=False), **companions})


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({}, ()),
        ({"vision_weights_repo": VISION}, (CompanionSpec("vision", VISION, None),)),
        ({"vision_weights_repo": VISION, "vision_weights_file": "mmproj-f16.gguf"},
         (CompanionSpec("vision", VISION, "mmproj-f16.gguf"),)),
        (DRAFTING, (CompanionSpec("served_draft", DRAFT, "d-Q4_0.gguf"),)),
        # A draft the card names but does not draft with is never downloaded.
        ({**DRAFTING, "runtime": {"speculative": "ngram"}}, ()),
        ({**DRAFTING, "runtime": {}}, ()),
        ({**DRAFTING, "vision_weights_repo": VISION},
         (CompanionSpec("vision", VISION, None), CompanionSpec("served_draft", DRAFT, "d-Q4_0.gguf"))),
    ],
)
def test_companion_download_specs(fields, expected):
    card = card_with(**fields)
    assert companion_download_specs(card) == expected
    assert companion_repo_ids(card) == frozenset(s.repo_id for s in expected)


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"served_spec_draft_file": "d.gguf"}, "served_spec_draft_file"),  # a file without its repo
        ({"vision_weights_file": "mmproj.gguf"}, "vision_weights_file"),
        ({"served_spec_draft_repo": DRAFT, "served_spec_draft_size_bytes": 10}, "served_spec_draft_file"),
        ({"served_spec_draft_repo": DRAFT, "served_spec_draft_file": "d.gguf"}, "served_spec_draft_size_bytes"),
        ({"served_spec_draft_size_bytes": 10}, "served_spec_draft_size_bytes"),
        ({"runtime": {"speculative": "draft"}}, "runtime.speculative"),  # drafting without a draft
        ({**DRAFTING, "served_spec_draft_repo": TINY_GGUF_REPO}, "served_spec_draft_repo"),  # its own repo
        ({**DRAFTING, "served_spec_draft_repo": "local/x"}, "served_spec_draft_repo"),
        ({"vision_weights_repo": "not a repo"}, "vision_weights_repo"),
        ({"vision_weights_repo": TINY_GGUF_REPO}, "vision_weights_repo"),  # its own repo, no projector file
        ({"vision_weights_repo": TINY_GGUF_REPO, "vision_weights_file": GGUF_FILE}, "vision_weights_repo"),
        ({"vision_weights_size_bytes": 10}, "vision_weights_size_bytes"),  # no projector to size
        ({"vision_weights_repo": VISION, "vision_weights_size_bytes": 10}, "vision_weights_size_bytes"),
    ],
)
def test_inconsistent_companion_fields_name_the_field(fields, field):
    with pytest.raises(ValidationError) as caught:
        card_with(**fields)
    named = {(e.get("ctx") or {}).get("field") for e in caught.value.errors()}
    named |= {".".join(str(part) for part in e["loc"]) for e in caught.value.errors()}
    assert field in named, caught.value.errors()


MLX_DRAFT = "acme/draft-mlx"
MLX_DRAFTING = {"served_spec_draft_repo": MLX_DRAFT, "served_spec_draft_size_bytes": 1_000_000,
                "runtime": {"speculative": "draft"}}


def mlx_card_with(**companions) -> ModelCard:
    base = hub_card(TINY_MLX_REPO)
    return ModelCard.model_validate({**base.model_dump(by_alias=False), **companions})


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        (MLX_DRAFTING, None),  # a safetensors card drafts with a whole safetensors repo
        ({**MLX_DRAFTING, "served_spec_draft_file": "d.gguf"}, "served_spec_draft_file"),  # a GGUF draft
        ({**MLX_DRAFTING, "served_spec_draft_size_bytes": None}, "served_spec_draft_size_bytes"),
        ({"runtime": {"speculative": "draft"}}, "runtime.speculative"),
        ({**MLX_DRAFTING, "served_spec_draft_repo": TINY_MLX_REPO}, "served_spec_draft_repo"),  # its own repo
    ],
)
def test_an_mlx_cards_draft_is_a_safetensors_repo(fields, field):
    if field is None:
        card = mlx_card_with(**fields)
        assert companion_download_specs(card) == (CompanionSpec("served_draft", MLX_DRAFT, None),)
        companion = companion_card(card, companion_download_specs(card)[0])
        assert (companion.model_id, companion.artifact_format) == (MLX_DRAFT, "safetensors")
        assert draft_model_path(card, {MLX_DRAFT: "/m/acme--draft-mlx"}) == "/m/acme--draft-mlx"
        return
    with pytest.raises(ValidationError) as caught:
        mlx_card_with(**fields)
    named = {(e.get("ctx") or {}).get("field") for e in caught.value.errors()}
    assert field in named, caught.value.errors()


def test_a_gguf_repo_may_ship_its_own_projector():
    card = card_with(vision_weights_repo=TINY_GGUF_REPO, vision_weights_file="mmproj-f16.gguf")
    assert companion_download_specs(card) == (CompanionSpec("vision", TINY_GGUF_REPO, "mmproj-f16.gguf"),)


def test_cards_without_companions_stay_valid_and_round_trip():
    base = hub_card(TINY_GGUF_REPO, gguf_file=GGUF_FILE)
    wire = base.to_wire()
    old_wire = {k: v for k, v in wire.items() if k not in {"servedSpecDraftRepo", "servedSpecDraftFile",
                                                            "servedSpecDraftSizeBytes", "visionWeightsRepo",
                                                            "visionWeightsFile"}}
    assert ModelCard.model_validate(old_wire) == base  # what an older node sent still parses
    with_one = card_with(vision_weights_repo=VISION)
    assert ModelCard.model_validate(with_one.to_wire()) == with_one


@pytest.mark.parametrize(("name", "alias"), [("mtp_sidecar_repo", "mtpSidecarRepo"),
                                             ("assistant_model_repo", "assistantModelRepo")])
def test_removed_companion_fields_are_refused_by_name_with_what_to_use(name, alias):
    for key in (name, alias):
        with pytest.raises(ValidationError, match=f"{name} was removed: no engine Skulk runs loads"):
            card_with(**{key: "acme/x"})


@pytest.mark.parametrize(
    ("spec", "fmt"),
    [(CompanionSpec("vision", VISION, None), "safetensors"),
     (CompanionSpec("served_draft", DRAFT, "d-Q4_0.gguf"), "gguf")],
)
def test_companion_card_describes_the_companions_artifact(spec, fmt):
    pinned = card_with(source_revision="a" * 40, vision_weights_repo=VISION, **DRAFTING)
    companion = companion_card(pinned, spec)
    assert (companion.model_id, companion.artifact_format, companion.gguf_file) == (spec.repo_id, fmt, spec.gguf_file)
    assert companion.source_revision is None and companion_download_specs(companion) == ()
    assert companion.runtime.speculative is None


# -- resolving them -------------------------------------------------------------------------------


def resolver(missing: set[str]):
    calls: list[str] = []

    def resolve(companion: ModelCard) -> Path:
        calls.append(companion.model_id)
        if companion.model_id in missing:
            raise DownloadFailed(companion.model_id, "the repository does not exist on the hub (404)", "not_found")
        return Path("/models") / companion.model_id

    return resolve, calls


def test_every_companion_is_resolved():
    card = card_with(vision_weights_repo=VISION, **DRAFTING)
    resolve, calls = resolver(set())
    assert ensure_companions(card, resolve) == {VISION: Path("/models") / VISION, DRAFT: Path("/models") / DRAFT}
    assert calls == [VISION, DRAFT]


@pytest.mark.parametrize("missing", [VISION, DRAFT])
def test_a_missing_companion_fails_the_model_naming_it(missing):
    card = card_with(vision_weights_repo=VISION, **DRAFTING)
    resolve, _calls = resolver({missing})
    with pytest.raises(DownloadFailed) as caught:
        ensure_companions(card, resolve)
    assert caught.value.model_id == card.model_id and caught.value.kind == "not_found"
    assert missing in caught.value.reason


@pytest.mark.parametrize(
    ("fields", "resolved", "expected"),
    [
        ({}, {}, None),
        (DRAFTING, {DRAFT: "/m/d.gguf"}, "/m/d.gguf"),
        (DRAFTING, {}, None),  # not resolved: the engine refuses to load (test_llama_server.py)
        ({**DRAFTING, "runtime": {"speculative": "ngram"}}, {DRAFT: "/m/d.gguf"}, None),
    ],
)
def test_draft_model_path(fields, resolved, expected):
    assert draft_model_path(card_with(**fields), resolved) == expected


SEEING = {"capabilities": ("text", "vision"), "vision_weights_repo": VISION, "vision_weights_file": "mmproj-f16.gguf"}


@pytest.mark.parametrize(
    ("fields", "resolved", "expected"),
    [
        ({}, {VISION: "/m/mmproj.gguf"}, None),  # a text card loads no projector
        (SEEING, {VISION: "/m/mmproj.gguf"}, "/m/mmproj.gguf"),
        (SEEING, {}, None),  # not resolved: the engine refuses to load (test_llama_server_vision.py)
        ({"capabilities": ("text", "vision")}, {}, None),  # a vision card naming no projector
    ],
)
def test_projector_path_of_a_hub_card(fields, resolved, expected):
    assert projector_path(card_with(**fields), resolved, "/m/model.gguf") == expected


def test_a_generated_vision_cards_projector_lies_beside_its_model():
    card = load_card(builtin_cards_dir() / "local--tiny-vlm-gguf.toml")
    assert projector_path(card, {}, "/models/local--tiny-vlm/model.gguf") == "/models/local--tiny-vlm/mmproj.gguf"
    text_only = load_card(builtin_cards_dir() / "local--tiny-llama-gguf.toml")
    assert projector_path(text_only, {}, "/models/local--tiny-llama/model.gguf") is None


# -- eviction: companions of live runners are in use ---------------------------------------------


def test_companions_of_live_runners_are_in_use():
    card = card_with(**DRAFTING)
    instance = tiny_instance(card)
    state = State(instances={instance.instance_id: instance})
    cards = {card.model_id: card}
    assert in_use_model_ids(state, NODE, companions_of(lambda: cards)) == {card.model_id, DRAFT}
    assert in_use_model_ids(state, "another-node", companions_of(lambda: cards)) == frozenset()


def test_a_live_runners_companion_copy_survives_a_purge(tmp_path):
    from tests.model_store.test_staging import make_canonical

    models, staging = tmp_path / "models", tmp_path / "staging"
    for model_id in (TINY_GGUF_REPO, DRAFT, "acme/idle"):
        m = make_canonical(models, model_id)
        stage_from_local(models / m.dir_name, m, staging, StagingOptions(free_bytes=lambda _p: 10**15))
    card = card_with(**DRAFTING)
    instance = tiny_instance(card)
    in_use = in_use_model_ids(State(instances={instance.instance_id: instance}), NODE,
                              companions_of(lambda: {card.model_id: card}))
    result = remove_staged(staging, in_use, models)
    assert result.removed == ("acme--idle",)
    assert sorted(result.kept_in_use) == sorted(["acme--draft-GGUF", "mock-org--tiny-llama-GGUF"])


def test_a_projectors_size_travels_with_the_card_not_with_its_companion():
    seeing = card_with(capabilities=["text", "vision"], vision_weights_repo=TINY_GGUF_REPO,
                       vision_weights_file="mmproj-f16.gguf", vision_weights_size_bytes=800_000_000)
    assert ModelCard.model_validate(seeing.to_wire()) == seeing
    (spec,) = companion_download_specs(seeing)
    companion = companion_card(seeing, spec)
    assert (companion.gguf_file, companion.vision_weights_size_bytes) == ("mmproj-f16.gguf", None)
