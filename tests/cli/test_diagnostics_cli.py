"""`skulk diagnostics capture` when the asked node does not answer: exit 1 with the reason,
and no archive written (the happy path runs against real nodes in
tests/observe/test_cluster_capture.py)."""

from __future__ import annotations

from typer.testing import CliRunner

from skulk.cli import app
from tests.nodeproc import free_port


def test_capture_from_a_node_that_does_not_answer_fails_with_the_reason(tmp_path):
    out = tmp_path / "c.tar.gz"
    url = f"http://127.0.0.1:{free_port()}"
    result = CliRunner().invoke(app, ["diagnostics", "capture", "-o", str(out), "--url", url],
                                catch_exceptions=False, env={"SKULK_API_KEY": ""})
    assert result.exit_code == 1
    assert "capture failed" in result.output and url in result.output
    assert not out.exists() and not list(tmp_path.iterdir())
