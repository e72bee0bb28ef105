"""`skulk service`: the systemd unit and launchd agent it writes (pure, and checked by the
platform's own verifier where this machine has it), and the CLI writing, enabling, querying
and removing a per-user unit with the service manager's commands recorded."""

from __future__ import annotations

import os
import plistlib
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from skulk.service.units import (
    ENV_FILE_TEMPLATE,
    LAUNCHD_LABEL,
    install_commands,
    launchd_plist,
    manager_for,
    parse_env_file,
    service_plan,
    status_command,
    systemd_unit,
    uninstall_commands,
)

HOME = Path("/home/ada")
DATA = Path("/srv/skulk")


def plan(manager="systemd", user_scope=False, run_as=None):
    return service_plan(manager, user_scope=user_scope, python=sys.executable, data_dir=DATA, home=HOME, run_as=run_as)


@pytest.mark.parametrize(("user_scope", "run_as", "path", "wanted", "user_line"), [
    (False, "skulk", "/etc/systemd/system/skulk.service", "WantedBy=multi-user.target", "User=skulk\n"),
    (True, None, "/home/ada/.config/systemd/user/skulk.service", "WantedBy=default.target", ""),
])
def test_the_systemd_unit(user_scope, run_as, path, wanted, user_line):
    chosen = plan(user_scope=user_scope, run_as=run_as)
    text = systemd_unit(chosen)
    assert str(chosen.unit_path) == path
    for line in (f"ExecStart={sys.executable} -m skulk run --data-dir /srv/skulk", "Restart=on-failure",
                 "OOMPolicy=continue", "KillMode=mixed", "EnvironmentFile=-/srv/skulk/service.env", wanted):
        assert line + "\n" in text
    assert (user_line in text) if user_line else "User=" not in text


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze on this machine")
@pytest.mark.parametrize("user_scope", [False, True])
def test_systemd_accepts_the_unit(tmp_path, user_scope):
    unit = tmp_path / "skulk.service"
    unit.write_text(systemd_unit(plan(user_scope=user_scope)))
    # Checked in system mode for both: `--user` needs a user session (XDG_RUNTIME_DIR), and
    # the directives are the same.
    done = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60)
    # verify warns about a value it cannot parse and still exits 0: no output at all is the bar.
    problems = [line for line in done.stderr.splitlines() if "skulk.service" in line]
    assert done.returncode == 0 and not problems, done.stderr


def test_run_as_belongs_to_a_system_wide_service():
    with pytest.raises(ValueError, match="a --user service runs as you"):
        plan(user_scope=True, run_as="skulk")
    daemon = plistlib.loads(launchd_plist(plan("launchd", run_as="skulk"), {}))
    assert daemon["UserName"] == "skulk"


def test_the_launchd_agent_parses_and_restarts_on_failure():
    agent = plan("launchd", user_scope=True)
    assert agent.unit_path == HOME / "Library" / "LaunchAgents" / f"{LAUNCHD_LABEL}.plist"
    loaded = plistlib.loads(launchd_plist(agent, {"SKULK_LLAMA_SERVER_PARALLEL": "8"}))
    assert loaded["Label"] == LAUNCHD_LABEL and loaded["RunAtLoad"] is True
    assert loaded["ProgramArguments"] == [sys.executable, "-m", "skulk", "run", "--data-dir", "/srv/skulk"]
    assert loaded["KeepAlive"] == {"SuccessfulExit": False}
    assert loaded["EnvironmentVariables"] == {"SKULK_LLAMA_SERVER_PARALLEL": "8"}
    if shutil.which("plutil"):
        assert subprocess.run(["plutil", "-lint", "-"], input=launchd_plist(agent, {}), timeout=30).returncode == 0


@pytest.mark.parametrize(("text", "parsed"), [
    (ENV_FILE_TEMPLATE, {}),
    ("A=1\nexport B = two\n# C=3\n\nD='q u'\nE=\"x\"\nnot a line\n=empty\n", {"A": "1", "B": "two", "D": "q u", "E": "x"}),
])
def test_parse_env_file(text, parsed):
    assert parse_env_file(text) == parsed


@pytest.mark.parametrize(("manager", "user_scope", "install", "status", "uninstall"), [
    ("systemd", True, [["systemctl", "--user", "daemon-reload"], ["systemctl", "--user", "enable", "--now", "skulk"]],
     ["systemctl", "--user", "status", "--no-pager", "skulk"],
     [["systemctl", "--user", "disable", "--now", "skulk"], ["systemctl", "--user", "daemon-reload"]]),
    ("launchd", True, [["launchctl", "bootstrap", "gui/501", f"/home/ada/Library/LaunchAgents/{LAUNCHD_LABEL}.plist"]],
     ["launchctl", "print", f"gui/501/{LAUNCHD_LABEL}"], [["launchctl", "bootout", f"gui/501/{LAUNCHD_LABEL}"]]),
])
def test_the_managers_commands(manager, user_scope, install, status, uninstall):
    chosen = plan(manager, user_scope)
    assert install_commands(chosen, 501) == install
    assert status_command(chosen, 501) == status
    assert uninstall_commands(chosen, 501) == uninstall


@pytest.mark.parametrize(("platform", "manager"), [("linux", "systemd"), ("darwin", "launchd"), ("win32", None)])
def test_manager_for(platform, manager):
    assert manager_for(platform) == manager


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the CLI run writes a systemd unit")
def test_the_cli_installs_queries_and_removes_a_user_unit(tmp_path):
    """With `systemctl` replaced by a script that records its arguments (this machine has no
    running systemd to enable anything in), the CLI writes the unit and a private settings
    file, runs the enabling commands, asks for status, and removes the unit again."""
    stubs, home, data = tmp_path / "bin", tmp_path / "home", tmp_path / "data"
    stubs.mkdir()
    calls = tmp_path / "calls"
    systemctl = stubs / "systemctl"
    systemctl.write_text(f"#!/bin/sh\necho \"$@\" >> {calls}\n")
    systemctl.chmod(0o755)
    env = {**os.environ, "PATH": f"{stubs}:{os.environ['PATH']}", "HOME": str(home)}

    def skulk(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "skulk", "service", *args, "--user", "--data-dir", str(data)],
                              env=env, capture_output=True, text=True, timeout=60)

    dry = skulk("install", "--dry-run")
    unit = home / ".config" / "systemd" / "user" / "skulk.service"
    assert dry.returncode == 0 and "OOMPolicy=continue" in dry.stdout and not unit.exists()
    installed = skulk("install")
    assert installed.returncode == 0, installed.stderr
    assert unit.read_text() == systemd_unit(service_plan("systemd", user_scope=True, python=sys.executable,
                                                         data_dir=data.resolve(), home=home))
    settings = data / "service.env"
    assert settings.read_text() == ENV_FILE_TEMPLATE and stat.S_IMODE(settings.stat().st_mode) == 0o600
    assert skulk("status").returncode == 0
    assert skulk("uninstall").returncode == 0 and not unit.exists() and settings.exists()
    assert calls.read_text().splitlines() == ["--user daemon-reload", "--user enable --now skulk",
                                              "--user status --no-pager skulk", "--user disable --now skulk",
                                              "--user daemon-reload"]
