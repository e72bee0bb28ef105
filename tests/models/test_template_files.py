"""Where a safetensors model keeps its chat template: the first of chat_template.jinja,
chat_template.json and tokenizer_config.json that holds one, named templates joined."""

from __future__ import annotations

import json

import pytest

from skulk.models.template_files import chat_template

THINK = "{{ '<think>' }}{{ '</think>' }}"


@pytest.mark.parametrize(("files", "expected"), [
    ({}, None),
    ({"tokenizer_config.json": json.dumps({"chat_template": THINK})}, THINK),
    ({"tokenizer_config.json": json.dumps({"chat_template": [
        {"name": "default", "template": "A"}, {"name": "tool_use", "template": "<tool_call>"}]})}, "A\n<tool_call>"),
    ({"chat_template.jinja": "J", "tokenizer_config.json": json.dumps({"chat_template": "T"})}, "J"),
    ({"chat_template.json": json.dumps({"chat_template": "P"}), "tokenizer_config.json": "{}"}, "P"),
    # a file without a template, or not JSON, leaves the next one to answer
    ({"chat_template.json": "not json", "tokenizer_config.json": json.dumps({"chat_template": "T"})}, "T"),
    ({"tokenizer_config.json": json.dumps({"bos_token": "<s>"})}, None),
    ({"tokenizer_config.json": json.dumps({"chat_template": 3})}, None),
    ({"tokenizer_config.json": json.dumps(["a list"])}, None),
])
def test_chat_template(files, expected):
    assert chat_template(files.get) == expected
