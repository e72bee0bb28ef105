"""Every `SKULK_*` setting is declared once in `skulk.shared.settings`, read only through
it, and listed in docs/SETTINGS.md exactly as the registry renders it."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from skulk.shared.settings import SETTINGS, UnknownSetting, declared, setting, settings_table

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "skulk"
REGISTRY = SRC / "shared" / "settings.py"
NAME = re.compile(r"\bSKULK_[A-Z0-9_]*[A-Z0-9]\b")


def _sources() -> list[Path]:
    return [p for p in sorted(SRC.rglob("*.py")) if p != REGISTRY]


def test_every_name_in_src_is_declared():
    undeclared = []
    for path in _sources():
        for line_number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            for name in NAME.findall(line):
                try:
                    declared(name)
                except UnknownSetting:
                    undeclared.append(f"{path.relative_to(ROOT)}:{line_number}: {name}")
    assert not undeclared, "declare these in skulk.shared.settings.SETTINGS:\n" + "\n".join(undeclared)


def test_every_declared_name_is_used():
    text = "\n".join(p.read_text(encoding="utf-8") for p in _sources())
    unused = [s.name for s in SETTINGS if "<ENGINE>" not in s.name and s.name not in text]
    assert not unused, f"declared but read nowhere: {unused}"


def _is_name(node: ast.expr | None) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str) and bool(NAME.fullmatch(node.value))


def _setting_constants() -> set[str]:
    """Module-level names bound to a SKULK_* string, or to a mapping built from them
    (`ENGINE_BINARY_ENV`), anywhere in src."""
    names: set[str] = set()
    for path in _sources():
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
            if value is None:
                continue
            names_settings = _is_name(value) or (
                isinstance(value, (ast.Dict, ast.DictComp, ast.Call)) and "SKULK_" in ast.unparse(value))
            if names_settings:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names.update(t.id for t in targets if isinstance(t, ast.Name))
    return names


def _names_a_setting(node: ast.expr, constants: set[str]) -> bool:
    if _is_name(node):
        return True
    if isinstance(node, ast.Name):
        return node.id in constants
    if isinstance(node, ast.Subscript):  # ENGINE_BINARY_ENV["vllm"]
        return _names_a_setting(node.value, constants)
    return False


def test_settings_are_read_only_through_the_registry():
    """No `env.get(SKULK_...)`, `os.environ[...]` or `getenv` of a setting outside the
    registry (writing one, for a runner's environment, is fine)."""
    constants = _setting_constants()
    reads = []
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            key = None
            if isinstance(node, ast.Call) and node.args and (
                    (isinstance(node.func, ast.Attribute) and node.func.attr in ("get", "getenv"))
                    or (isinstance(node.func, ast.Name) and node.func.id == "getenv")):
                key = node.args[0]
            elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
                key = node.slice
            if key is not None and _names_a_setting(key, constants):
                reads.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}")
    assert not reads, "read these through skulk.shared.settings.setting:\n" + "\n".join(reads)


def test_the_settings_doc_is_the_registry():
    doc = (ROOT / "docs" / "SETTINGS.md").read_text(encoding="utf-8")
    assert settings_table() in doc, "docs/SETTINGS.md is stale: paste settings_table() (scripts/gen_settings_doc.py)"


@pytest.mark.parametrize(("name", "env", "expected"), [
    ("SKULK_API_PORT", {"SKULK_API_PORT": " 8080 "}, "8080"),
    ("SKULK_API_PORT", {}, ""),
    ("SKULK_LLAMA_CPP_BACKENDS", {"SKULK_LLAMA_CPP_BACKENDS": "cuda,cpu"}, "cuda,cpu"),
])
def test_setting_reads_declared_names(name, env, expected):
    assert setting(name, env) == expected


def test_an_undeclared_name_is_refused():
    with pytest.raises(UnknownSetting):
        setting("SKULK_NOT_A_SETTING", {})
