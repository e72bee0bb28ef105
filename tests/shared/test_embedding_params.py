"""EmbeddingParams carries text or token arrays, exactly one kind, and survives the wire."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from skulk.shared.types.tasks import EmbeddingParams


@pytest.mark.parametrize(
    ("fields", "embedded"),
    [
        ({"inputs": ["a", "b"]}, ["a", "b"]),
        ({"token_inputs": [[1, 2], [3]]}, [[1, 2], [3]]),
    ],
)
def test_one_kind_of_input_round_trips(fields, embedded):
    params = EmbeddingParams(model_id="m", **fields)
    assert params.embedding_inputs == embedded
    assert EmbeddingParams.model_validate(params.to_wire()) == params


@pytest.mark.parametrize(
    "fields",
    [{}, {"inputs": []}, {"inputs": ["a"], "token_inputs": [[1]]}, {"token_inputs": [[]]}, {"token_inputs": [[1], []]}],
)
def test_neither_both_nor_empty_token_arrays(fields):
    with pytest.raises(ValidationError):
        EmbeddingParams(model_id="m", **fields)
