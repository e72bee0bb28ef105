"""`strict: true` on a function tool: a call the client receives always matches the tool's
schema, whether the call was forced or the model chose it.

A forced call (`tool_choice` "required" or a named tool) is grammar-constrained from its
first token (`skulk.shared.tool_grammar`). When the model calls a strict tool of its own
accord (`tool_choice` "auto"), its output is not constrained (constraining every free-text
answer would slow every request), so the finished call is checked against the schema here
(jsonschema, Draft 2020-12, the dialect OpenAI and Anthropic document). A call that breaks
it is never delivered: the API generates the call again with that tool forced, whose grammar
makes it valid (`strict_retry_params`), and a schema no grammar here can enforce ends the
request with the typed error `tool_call_invalid` (StreamErrorType.TOOL_CALL_INVALID),
naming the tool, the place in the arguments and the rule broken.

Pure: no streams, no engines.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError, best_match

from skulk.api.errors import InvalidRequest
from skulk.shared.tool_grammar import SchemaNotSupported, tool_arguments_schema, tool_call_grammar
from skulk.shared.types.common import ToolCall, ToolSpec, Usage
from skulk.shared.types.tasks import TextGenerationParams


@dataclass(frozen=True)
class StrictViolation:
    """A call of a strict tool whose arguments break the tool's schema."""

    tool: str
    path: str
    """Where in the arguments, as a JSON pointer ('/' for the whole object)."""
    reason: str

    def message(self) -> str:
        return (f"The model called the strict tool {self.tool!r} with arguments that break its schema at "
                f"'{self.path}': {self.reason}")


def check_strict_schemas(tools: Sequence[ToolSpec], schema_param: Callable[[int], str]) -> None:
    """`InvalidRequest` when a strict tool's parameters are not a valid JSON Schema (nothing
    could be checked against them); `schema_param(index)` names the caller's field."""
    for index, tool in enumerate(tools):
        if not tool.strict:
            continue
        try:
            Draft202012Validator.check_schema(tool_arguments_schema(tool))
        except SchemaError as exc:
            raise InvalidRequest(f"tools[{index}] {tool.name!r} is strict, but its schema is not valid JSON Schema: "
                                 f"{exc.message}", param=schema_param(index), code="invalid_tool_schema") from None


def strict_violation(calls: Sequence[ToolCall], tools: Sequence[ToolSpec]) -> StrictViolation | None:
    """The first call of a strict tool whose arguments break its schema, or None."""
    strict = {tool.name: tool for tool in tools if tool.strict}
    for call in calls:
        tool = strict.get(call.name)
        if tool is None:
            continue
        try:
            arguments = json.loads(call.arguments)
        except ValueError as exc:  # the parser hands over canonical JSON; kept total all the same
            return StrictViolation(call.name, "/", f"the arguments are not JSON ({exc})")
        error = best_match(Draft202012Validator(tool_arguments_schema(tool)).iter_errors(arguments))
        if error is not None:
            path = "/" + "/".join(str(part) for part in error.absolute_path)
            return StrictViolation(call.name, path, error.message)
    return None


def strict_retry_params(params: TextGenerationParams, violation: StrictViolation) -> TextGenerationParams | None:
    """The request again with the violating tool forced, so its grammar makes the call valid;
    None when that tool's schema is beyond what the grammar enforces."""
    choice = {"type": "function", "function": {"name": violation.tool}}
    try:
        tool_call_grammar(params.tools, choice)
    except SchemaNotSupported:
        return None
    return params.model_copy(update={"tool_choice": choice})


def combined_usage(first: Usage | None, retry: Usage | None) -> Usage | None:
    """What a request whose call was generated twice cost: the prompt once (the retry's is the
    same prompt, mostly from cache), the completion tokens of both runs."""
    if first is None or retry is None:
        return retry or first
    completion = first.completion_tokens + retry.completion_tokens
    return Usage(prompt_tokens=first.prompt_tokens, completion_tokens=completion,
                 total_tokens=first.prompt_tokens + completion, cached_tokens=first.cached_tokens,
                 drafted_tokens=first.drafted_tokens + retry.drafted_tokens,
                 accepted_draft_tokens=first.accepted_draft_tokens + retry.accepted_draft_tokens)


__all__ = [
    "StrictViolation",
    "check_strict_schemas",
    "combined_usage",
    "strict_retry_params",
    "strict_violation",
]
