"""Setting `telemetry.enabled` in an operator's skulk.yaml keeps the rest of the file as
they wrote it: comments, order, other sections, line endings."""

from __future__ import annotations

from pathlib import Path

import pytest

from skulk.datadir.config import ConfigError, parse_config
from skulk.datadir.config_edit import with_telemetry_enabled

P = Path("skulk.yaml")

COMMENTED = """\
# my node
node:
  name: studio   # the big one
  api_port: 6000

telemetry:
  # I said yes in the dashboard
  endpoint: http://127.0.0.1:9/in
  enabled: false  # flipped by the switch

tracing:
  retention_days: 1
"""


@pytest.mark.parametrize(
    ("before", "enabled", "after"),
    [
        # No file, or an empty one: the section alone.
        ("", True, "telemetry:\n  enabled: true\n"),
        ("# nothing yet\n", True, "# nothing yet\ntelemetry:\n  enabled: true\n"),
        # Other sections only: the section added at the end (a missing final newline mended).
        ("node:\n  name: a\n", True, "node:\n  name: a\ntelemetry:\n  enabled: true\n"),
        ("node:\n  name: a", False, "node:\n  name: a\ntelemetry:\n  enabled: false\n"),
        # The key is there: its value changes in place, comments and order kept.
        (COMMENTED, True, COMMENTED.replace("enabled: false  # flipped", "enabled: true  # flipped")),
        ("telemetry:\n    enabled: yes\n", False, "telemetry:\n    enabled: false\n"),
        # The section is there without the key: added as its first key, at its indentation.
        ("telemetry:\n    flush_seconds: 5\nnode:\n  name: a\n", True,
         "telemetry:\n    enabled: true\n    flush_seconds: 5\nnode:\n  name: a\n"),
        ("telemetry:  # mine\n  flush_seconds: 5\n", True, "telemetry:  # mine\n  enabled: true\n  flush_seconds: 5\n"),
        # A key of the same name in another section is not touched.
        ("logging:\n  enabled: false\ntelemetry:\n  flush_seconds: 5\n", True,
         "logging:\n  enabled: false\ntelemetry:\n  enabled: true\n  flush_seconds: 5\n"),
        # Windows line endings stay Windows line endings.
        ("node:\r\n  name: a\r\n", True, "node:\r\n  name: a\r\ntelemetry:\r\n  enabled: true\r\n"),
        # Already as wanted: the same text.
        ("telemetry:\n  enabled: true # yes\n", True, "telemetry:\n  enabled: true # yes\n"),
    ],
)
def test_set_in_place(before, enabled, after):
    assert with_telemetry_enabled(before, enabled, P) == after
    assert parse_config(after, P).telemetry.enabled is enabled


def test_a_flow_mapping_is_written_back_out_with_every_setting():
    before = "node: {name: a, api_port: 6000}\ntelemetry: {enabled: false, flush_seconds: 5}\n"
    after = with_telemetry_enabled(before, True, P)
    config = parse_config(after, P)
    assert config.telemetry.enabled and config.telemetry.flush_seconds == 5
    assert config.node.name == "a" and config.node.api_port == 6000


def test_every_other_setting_reads_back_the_same():
    before = parse_config(COMMENTED, P)
    after = parse_config(with_telemetry_enabled(COMMENTED, True, P), P)
    assert after.model_copy(update={"telemetry": before.telemetry}) == before
    assert after.telemetry.endpoint == before.telemetry.endpoint


@pytest.mark.parametrize("broken", ["node: [", "telemetry:\n  enabeld: true\n", "- a\n- b\n",
                                    "telemetry:\n", "telemetry:\n  enabled:\n"])
def test_a_file_the_node_would_refuse_is_never_rewritten(broken):
    with pytest.raises(ConfigError):
        with_telemetry_enabled(broken, True, P)
