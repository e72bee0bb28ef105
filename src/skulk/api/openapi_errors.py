"""The error answers each wire format documents in the OpenAPI schema (`/openapi.json`,
`/docs`): every status its routes can answer (from the error kind tables in
`skulk.api.errors`), with the body shape clients parse, instead of FastAPI's default of a
lone 422 (which Skulk never sends: validation failures are 400s in the caller's shape).

Routers pass these as `responses=`; nothing here renders an error (`skulk.api.errors` does).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from skulk.api.errors import ANTHROPIC_STATUS, OPENAI_STATUS


class OpenAIErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class OpenAIError(BaseModel):
    """OpenAI's error body; `code` is stable (`context_length_exceeded`, `unsupported_feature`, ...)."""

    error: OpenAIErrorDetail


class AnthropicErrorDetail(BaseModel):
    type: str
    message: str


class AnthropicError(BaseModel):
    type: str = "error"
    error: AnthropicErrorDetail


class OllamaError(BaseModel):
    error: str


_WHEN = {
    400: "The request is wrong: a bad value, a feature the serving engine lacks, a prompt longer than the context.",
    401: "No API key, or a wrong one.",
    403: "Refused by the access policy (operator route, Host, cross-site request).",
    404: "The model is not placed (the message names the fix), or the id is unknown.",
    409: "A conflict with the current state.",
    413: "The request body is larger than api.max_body_bytes.",
    499: "The request was cancelled.",
    500: "An engine failure.",
    502: "A runner broke the stream protocol.",
    503: "No master yet, or the cluster is at capacity: retry (Retry-After).",
    504: "A deadline passed.",
    529: "Overloaded: retry.",
}


def _responses(statuses: set[int], model: type[BaseModel]) -> dict[int | str, dict[str, Any]]:
    return {status: {"model": model, "description": _WHEN.get(status, "An error.")} for status in sorted(statuses)}


OPENAI_ERROR_RESPONSES = _responses({status for status, _ in OPENAI_STATUS.values()}, OpenAIError)
ANTHROPIC_ERROR_RESPONSES = _responses({status for status, _ in ANTHROPIC_STATUS.values()}, AnthropicError)
OLLAMA_ERROR_RESPONSES = _responses({status for status, _ in OPENAI_STATUS.values()}, OllamaError)
"""Ollama answers `{"error": "..."}` with the status of the OpenAI table."""


def drop_validation_422(schema: dict[str, Any]) -> dict[str, Any]:
    """`schema` without FastAPI's automatic 422 answers: Skulk renders validation failures
    as 400s in the caller's shape (documented above), so a 422 is never sent."""
    for path in schema.get("paths", {}).values():
        for operation in path.values():
            if isinstance(operation, dict):
                operation.get("responses", {}).pop("422", None)
    return schema


__all__ = [
    "ANTHROPIC_ERROR_RESPONSES",
    "OLLAMA_ERROR_RESPONSES",
    "OPENAI_ERROR_RESPONSES",
    "AnthropicError",
    "OllamaError",
    "OpenAIError",
    "drop_validation_422",
]
