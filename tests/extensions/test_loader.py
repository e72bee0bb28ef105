"""Discovery: which installed extensions run, and the reason each skipped one gives."""

from __future__ import annotations

import sys
import types
from importlib.metadata import EntryPoint

import pytest

from skulk.extensions.contract import ExtensionShape, ExtensionShapeError, shape_of
from skulk.extensions.loader import ExtensionSet, admission_refusal, load_extensions, load_from


class Good:
    name = "audit"
    version = "1.0"
    skulk_versions = ">=0.1,<0.2"

    def observe_chat_response(self, summary, ctx):
        return None


def _shape(**over: object) -> ExtensionShape:
    base = dict(name="x", version="1", skulk_versions=">=0.1", failure_policy="skip", hooks=())
    base.update(over)
    return ExtensionShape(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("shape", "running", "taken", "expected"),
    [
        (_shape(), "0.1.0", [], None),
        (_shape(skulk_versions=">=0.2"), "0.1.0", [], "supports Skulk >=0.2, this node runs 0.1.0"),
        (_shape(skulk_versions="not a spec"), "0.1.0", [], "is not a PEP 440 specifier"),
        (_shape(skulk_versions="<0.2"), "0.2.0rc1", [], "supports Skulk <0.2"),
        (_shape(skulk_versions=">=0.1"), "0.2.0rc1", [], None),
        (_shape(), "0.1.0", ["x"], "already uses the name 'x'"),
    ],
)
def test_admission(shape: ExtensionShape, running: str, taken: list[str], expected: str | None) -> None:
    refusal = admission_refusal(shape, running, taken)
    if expected is None:
        assert refusal is None
    else:
        assert refusal is not None and expected in refusal


@pytest.mark.parametrize(
    ("attrs", "problem"),
    [
        ({"version": "1", "skulk_versions": ">=0"}, "name must be"),
        ({"name": "Bad Name", "version": "1", "skulk_versions": ">=0"}, "name must be"),
        ({"name": "ok", "skulk_versions": ">=0"}, "version must be"),
        ({"name": "ok", "version": "1"}, "skulk_versions must be"),
        ({"name": "ok", "version": "1", "skulk_versions": ">=0", "failure_policy": "explode"}, "failure_policy"),
    ],
)
def test_shape_refusals(attrs: dict[str, object], problem: str) -> None:
    with pytest.raises(ExtensionShapeError, match=problem):
        shape_of(types.SimpleNamespace(**attrs))


def test_shape_lists_the_hooks_it_defines() -> None:
    shape = shape_of(Good())
    assert shape.hooks == ("observe_chat_response",)
    assert shape.failure_policy == "skip"


@pytest.fixture
def fake_module(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    module = types.ModuleType("skulk_test_fake_exts")
    module.good = Good  # type: ignore[attr-defined]
    module.raising = lambda: (_ for _ in ()).throw(RuntimeError("boom"))  # type: ignore[attr-defined]
    module.not_callable = 42  # type: ignore[attr-defined]
    module.wrong_shape = lambda: object()  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, module.__name__, module)
    return module


def _ep(name: str, attr: str) -> EntryPoint:
    return EntryPoint(name=name, value=f"skulk_test_fake_exts:{attr}", group="skulk.extensions")


def test_broken_extensions_are_skipped_with_reasons_and_good_ones_load(fake_module: types.ModuleType) -> None:
    found = [
        _ep("a-good", "good"),
        _ep("b-dup", "good"),
        _ep("c-raises", "raising"),
        _ep("d-int", "not_callable"),
        _ep("e-shape", "wrong_shape"),
        EntryPoint(name="f-missing", value="skulk_no_such_module_here:x", group="skulk.extensions"),
    ]
    seen: list[str] = []
    result = load_from(found, "0.1.0", on_skip=lambda s: seen.append(s.entry_point))
    assert [ext.shape.name for ext in result.loaded] == ["audit"]
    reasons = {s.entry_point.split(" ")[0]: s.reason for s in result.skipped}
    assert "already uses the name 'audit'" in reasons["b-dup"]
    assert reasons["c-raises"] == "factory raised RuntimeError: boom"
    assert "not a callable factory" in reasons["d-int"]
    assert reasons["e-shape"].startswith("not an extension: name must be")
    assert reasons["f-missing"].startswith("import failed: ModuleNotFoundError")
    assert len(seen) == 5
    assert result.with_hook("observe_chat_response") == result.loaded
    assert result.with_hook("transform_chat_request") == ()


def test_the_kill_switch_skips_discovery(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SKULK_EXTENSIONS_DISABLE", "1")
    assert load_extensions() == ExtensionSet(disabled=True)
