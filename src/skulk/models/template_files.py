"""Where a safetensors (MLX) model keeps its chat template, read for the card builder.

A GGUF carries its template in its header; a Hugging Face model folder keeps it in one of
three files, newest convention first: `chat_template.jinja` (the template itself),
`chat_template.json` (processors: `{"chat_template": ...}`), and `tokenizer_config.json`
(`chat_template`: one template, or a list of named ones such as `default` and `tool_use`).
The card builder reads the reasoning format, its switches and the tool-call format from the
text, as it does from a GGUF's. Named templates are joined, so a tool format written only
in `tool_use` is still found.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json", "tokenizer_config.json")
"""The files that may hold the template, in the order they are tried."""


def _from_json(text: str) -> str | None:
    try:
        data: Any = json.loads(text)
    except ValueError:
        return None
    template = data.get("chat_template") if isinstance(data, dict) else None
    if isinstance(template, str):
        return template
    if isinstance(template, list):
        named = [entry.get("template") for entry in template if isinstance(entry, dict)]
        texts = [t for t in named if isinstance(t, str)]
        return "\n".join(texts) or None
    return None


def chat_template(read: Callable[[str], str | None]) -> str | None:
    """The model's chat template, from the first of `TEMPLATE_FILES` that holds one;
    `read(name)` gives a file's text, or None when the model has no such file."""
    for name in TEMPLATE_FILES:
        text = read(name)
        if text is None:
            continue
        template = text if name.endswith(".jinja") else _from_json(text)
        if template:
            return template
    return None


__all__ = ["TEMPLATE_FILES", "chat_template"]
