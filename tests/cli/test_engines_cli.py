"""`skulk engines list|install` as an operator types them."""

from __future__ import annotations

import json
import stat
from importlib.metadata import version

from typer.testing import CliRunner

from skulk.cli import app


def fake_install(engines, backend="cpu"):
    directory = engines / f"llama.cpp-{version('llama-cpp-python')}-{backend}"
    (directory / "bin").mkdir(parents=True)
    server = directory / "bin" / "llama-server"
    server.write_text("#!/bin/sh\necho 'version: 42 (fake)'\n")
    server.chmod(stat.S_IRWXU)
    (directory / "skulk-engine.json").write_text(json.dumps({"version": version("llama-cpp-python"), "backend": backend}))
    return server


def test_list_shows_installs_and_the_binary_the_node_uses(tmp_path, monkeypatch):
    monkeypatch.delenv("SKULK_LLAMA_SERVER_BIN", raising=False)
    server = fake_install(tmp_path / "engines")
    result = CliRunner().invoke(app, ["engines", "list"], env={"SKULK_ENGINES_DIR": str(tmp_path / "engines")})
    assert result.exit_code == 0, result.output
    assert "version: 42 (fake)" in result.output
    assert f"this node uses: {server} (managed, cpu)" in result.output


def test_list_with_nothing_installed_says_how_to_get_one(tmp_path, monkeypatch):
    monkeypatch.delenv("SKULK_LLAMA_SERVER_BIN", raising=False)
    result = CliRunner().invoke(app, ["engines", "list"], env={"SKULK_ENGINES_DIR": str(tmp_path)})
    assert result.exit_code == 0 and "skulk engines install" in result.output


def test_an_unknown_backend_is_a_usage_error(tmp_path):
    result = CliRunner().invoke(app, ["engines", "install", "--backend", "tpu"], env={"SKULK_ENGINES_DIR": str(tmp_path)})
    assert result.exit_code == 2
    assert "cpu, cuda, vulkan, metal" in result.output
