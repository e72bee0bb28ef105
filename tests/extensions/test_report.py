"""The extensions section of diagnostics, and the lines `skulk extensions list` shows
from what discovery found (`skulk doctor`'s check: tests/facts/test_doctor.py)."""

from __future__ import annotations

from skulk.extensions.contract import ExtensionShape
from skulk.extensions.loader import ExtensionSet, LoadedExtension, SkippedExtension
from skulk.extensions.report import discovery_report, report_lines

LOADED = LoadedExtension(
    shape=ExtensionShape(
        name="stamp", version="1.2", skulk_versions=">=0.1", failure_policy="fail", hooks=("transform_chat_request",)
    ),
    obj=object(),
    entry_point="stamp = stamp:make",
)
SKIPPED = SkippedExtension("old = old:make", "supports Skulk <0.0.1, this node runs 0.1.0", name="old")
FOUND = ExtensionSet(loaded=(LOADED,), skipped=(SKIPPED,))


def test_discovery_report_and_its_lines() -> None:
    section = discovery_report(FOUND)
    assert section["loaded"][0] | {"counters": None} == {
        "name": "stamp",
        "version": "1.2",
        "entryPoint": "stamp = stamp:make",
        "skulkVersions": ">=0.1",
        "hooks": ["transform_chat_request"],
        "failurePolicy": "fail",
        "counters": None,
    }
    section["loaded"][0]["counters"] = {"transform_chat_request": {"calls": 3, "failures": 1, "timeouts": 0}}
    lines = report_lines(section)
    assert lines[0].startswith("loaded   stamp 1.2  [transform_chat_request; on failure: fail]")
    assert "transform_chat_request: 3 calls, 1 failures, 0 timeouts" in lines[1]
    assert lines[2] == "skipped  old: supports Skulk <0.0.1, this node runs 0.1.0"


def test_nothing_installed_and_disabled() -> None:
    assert report_lines(discovery_report(ExtensionSet())) == [
        "no extensions installed (entry-point group skulk.extensions)"
    ]
    assert "SKULK_EXTENSIONS_DISABLE" in report_lines(discovery_report(ExtensionSet(disabled=True)))[0]
