"""The OpenAI Embeddings wire format (`POST /v1/embeddings`), both ways.

Incoming: `EmbeddingRequest` and `to_params`, which normalises `input` into
`EmbeddingParams` or raises `InvalidRequest` naming the parameter: a string or a list of
strings becomes text `inputs`; a token array (a list of ints, or a list of such lists)
becomes `token_inputs`, embedded as given (the engine checks the ids against its vocabulary,
a 400 when one is outside it). Text and token arrays cannot be mixed in one request.
Outgoing: `embedding_response` builds the `list` of `embedding` objects, each vector as
floats or, for `encoding_format: "base64"` (what the official SDK asks for by default),
as base64 of little-endian float32, which is exactly what the SDK decodes.

Pure translation only: this module must never touch streams, commands or the cluster.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, ValidationError

from skulk.api.errors import InvalidRequest, invalid_request_from_validation
from skulk.shared.json_shapes import is_json_array
from skulk.shared.types.common import Usage
from skulk.shared.types.ids import ModelId
from skulk.shared.types.tasks import EmbeddingParams

MAX_EMBEDDING_INPUTS = 2048
"""OpenAI's bound on the number of inputs in one request; it also bounds one command's
payload here."""

EncodingFormat = Literal["float", "base64"]


class EmbeddingRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str
    input: str | list[str] | list[int] | list[list[int]]
    encoding_format: EncodingFormat = "float"
    dimensions: int | None = None
    user: str | None = None


MAX_TOKEN_ID = 2**31 - 1
"""The largest token id worth carrying (llama.cpp's ids are int32); a larger one could not
be in any vocabulary, and bounding it here keeps it off the cluster's framing."""


def _inputs(value: str | list[str] | list[int] | list[list[int]]) -> tuple[list[str], list[list[int]]]:
    """(text inputs, token inputs): exactly one of them non-empty."""
    items: list[Any] = [value] if isinstance(value, str) else list(value)
    if not items:
        raise InvalidRequest("'input' must not be empty.", param="input")
    if all(isinstance(item, int) for item in items):
        items = [items]  # one token array
    if len(items) > MAX_EMBEDDING_INPUTS:
        raise InvalidRequest(f"'input' may hold at most {MAX_EMBEDDING_INPUTS} items, got {len(items)}.", param="input")
    if all(isinstance(item, str) for item in items):
        for index, item in enumerate(items):
            if not item:
                raise InvalidRequest("An input must not be an empty string.", param=f"input[{index}]")
        return items, []
    for index, item in enumerate(items):
        if not is_json_array(item):
            raise InvalidRequest("'input' must be text or token arrays, not a mix of both.", param=f"input[{index}]")
        if not item:
            raise InvalidRequest("A token array must not be empty.", param=f"input[{index}]")
        for token in item:
            if not 0 <= token <= MAX_TOKEN_ID:
                raise InvalidRequest(f"Token id {token} is not a valid token id.", param=f"input[{index}]")
    return [], items


def to_params(request: EmbeddingRequest) -> EmbeddingParams:
    if not request.model.strip():
        raise InvalidRequest("'model' must name a model.", param="model")
    if request.dimensions is not None and request.dimensions < 1:
        raise InvalidRequest(f"'dimensions' must be at least 1, got {request.dimensions}.", param="dimensions")
    texts, tokens = _inputs(request.input)
    try:
        return EmbeddingParams(model_id=ModelId(request.model), inputs=texts, token_inputs=tokens, dimensions=request.dimensions)
    except ValidationError as error:
        raise invalid_request_from_validation(error) from None


def encode_vector(vector: Sequence[float], encoding_format: EncodingFormat) -> list[float] | str:
    if encoding_format == "float":
        return list(vector)
    return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode("ascii")


def embedding_response(
    vectors: Sequence[Sequence[float]], usage: Usage | None, *, model: str, encoding_format: EncodingFormat
) -> dict[str, Any]:
    prompt_tokens = usage.prompt_tokens if usage is not None else 0
    return {
        "object": "list",
        "data": [
            {"object": "embedding", "index": index, "embedding": encode_vector(vector, encoding_format)}
            for index, vector in enumerate(vectors)
        ],
        "model": model,
        "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
    }


__all__ = [
    "MAX_EMBEDDING_INPUTS", "MAX_TOKEN_ID", "EmbeddingRequest", "embedding_response", "encode_vector", "to_params",
]
