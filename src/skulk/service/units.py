"""The service definitions `skulk service install` writes, as pure functions of a plan.

A node started at boot and restarted after a crash is what an operator of a home lab
expects; the two set-up commands of the README stay what they are and the service is an
optional third. Linux gets a systemd unit: `Restart=on-failure` brings a crashed node back,
`OOMPolicy=continue` keeps the node up when the kernel's OOM killer takes one of its runners
(the node re-places that runner's work; without it systemd would stop the whole unit),
`KillMode=mixed` lets the node stop its own runners and engine servers on SIGTERM before
anything left is killed, and settings come from an environment file beside the data dir, so
changing one never means editing the unit. macOS gets a launchd agent with the same
behaviour (`KeepAlive` on an unsuccessful exit), its environment read from the same file at
install time.

Pure: paths, text and argument lists in, nothing run, nothing written
(`skulk.cli_service` is the shell).
"""

from __future__ import annotations

import plistlib
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

SERVICE_NAME = "skulk"
LAUNCHD_LABEL = "ai.skulk.node"
ENV_FILE_NAME = "service.env"

Manager = Literal["systemd", "launchd"]

ENV_FILE_TEMPLATE = """\
# Settings for the skulk service, one KEY=VALUE per line (docs/SETTINGS.md lists them all).
# systemd reads this file at every start; on macOS run `skulk service install` again after
# editing it. Examples:
# SKULK_LLAMA_SERVER_PARALLEL=4
# SKULK_KV_COLD_BUDGET_MB=2048
"""


@dataclass(frozen=True)
class ServicePlan:
    """Everything a service definition says, decided once."""

    manager: Manager
    user_scope: bool
    """A per-user service (systemd --user, a launchd agent) rather than a system one."""
    command: tuple[str, ...]
    """The node's command line: this Python running `skulk run` on the data dir."""
    data_dir: Path
    env_file: Path
    unit_path: Path
    run_as: str | None = None
    """The account a system-wide service runs the node as (None: root). A per-user service
    runs as its user: `service_plan` refuses both."""


def service_plan(manager: Manager, *, user_scope: bool, python: str, data_dir: Path, home: Path,
                 run_as: str | None = None) -> ServicePlan:
    """The plan for this machine: where the definition goes and what it runs. ValueError
    for `run_as` on a per-user service (it runs as its user)."""
    if user_scope and run_as:
        raise ValueError("--run-as names the account of a system-wide service; a --user service runs as you")
    command = (python, "-m", "skulk", "run", "--data-dir", str(data_dir))
    env_file = data_dir / ENV_FILE_NAME
    if manager == "launchd":
        unit = (home / "Library" / "LaunchAgents" if user_scope else Path("/Library/LaunchDaemons")) / f"{LAUNCHD_LABEL}.plist"
    elif user_scope:
        unit = home / ".config" / "systemd" / "user" / f"{SERVICE_NAME}.service"
    else:
        unit = Path("/etc/systemd/system") / f"{SERVICE_NAME}.service"
    return ServicePlan(manager, user_scope, command, data_dir, env_file, unit, run_as)


def systemd_unit(plan: ServicePlan) -> str:
    """The systemd unit text for `plan`."""
    user = f"User={plan.run_as}\n" if plan.run_as else ""
    wanted = "default.target" if plan.user_scope else "multi-user.target"
    return (
        "[Unit]\n"
        "Description=Skulk node (one machine of a Skulk AI compute cluster)\n"
        "Wants=network-online.target\n"
        "After=network-online.target\n"
        "\n"
        "[Service]\n"
        "Type=simple\n"
        f"ExecStart={shlex.join(plan.command)}\n"
        f"EnvironmentFile=-{plan.env_file}\n"
        f"{user}"
        "Restart=on-failure\n"
        "RestartSec=5\n"
        "OOMPolicy=continue\n"
        "KillMode=mixed\n"
        "TimeoutStopSec=60\n"
        "LimitNOFILE=65536\n"
        "\n"
        "[Install]\n"
        f"WantedBy={wanted}\n"
    )


def parse_env_file(text: str) -> dict[str, str]:
    """KEY=VALUE lines (comments, blanks and an optional `export ` skipped; one layer of
    matching quotes removed), as systemd's EnvironmentFile reads them."""
    values: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        line = line.removeprefix("export ").strip()
        key, sep, value = line.partition("=")
        if not sep or not key.strip():
            continue
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]
        values[key.strip()] = value
    return values


def launchd_plist(plan: ServicePlan, environment: Mapping[str, str]) -> bytes:
    """The launchd property list for `plan`, with `environment` (the env file's settings)."""
    logs = plan.data_dir / "logs"
    definition: dict[str, object] = {
        "Label": LAUNCHD_LABEL,
        "ProgramArguments": list(plan.command),
        "RunAtLoad": True,
        "KeepAlive": {"SuccessfulExit": False},
        "ThrottleInterval": 5,
        "StandardOutPath": str(logs / "service.out.log"),
        "StandardErrorPath": str(logs / "service.err.log"),
        "EnvironmentVariables": dict(environment),
    }
    if plan.run_as:
        definition["UserName"] = plan.run_as
    return plistlib.dumps(definition)


def install_commands(plan: ServicePlan, uid: int) -> list[list[str]]:
    """What enables and starts the written definition."""
    if plan.manager == "launchd":
        return [["launchctl", "bootstrap", _launchd_domain(plan, uid), str(plan.unit_path)]]
    scope = ["--user"] if plan.user_scope else []
    return [["systemctl", *scope, "daemon-reload"], ["systemctl", *scope, "enable", "--now", SERVICE_NAME]]


def status_command(plan: ServicePlan, uid: int) -> list[str]:
    if plan.manager == "launchd":
        return ["launchctl", "print", f"{_launchd_domain(plan, uid)}/{LAUNCHD_LABEL}"]
    return ["systemctl", *(["--user"] if plan.user_scope else []), "status", "--no-pager", SERVICE_NAME]


def uninstall_commands(plan: ServicePlan, uid: int) -> list[list[str]]:
    """What stops and disables it, before its definition is removed."""
    if plan.manager == "launchd":
        return [["launchctl", "bootout", f"{_launchd_domain(plan, uid)}/{LAUNCHD_LABEL}"]]
    scope = ["--user"] if plan.user_scope else []
    return [["systemctl", *scope, "disable", "--now", SERVICE_NAME], ["systemctl", *scope, "daemon-reload"]]


def _launchd_domain(plan: ServicePlan, uid: int) -> str:
    return f"gui/{uid}" if plan.user_scope else "system"


def manager_for(platform: str) -> Manager | None:
    """The service manager of `sys.platform`, or None where Skulk writes no service."""
    if platform.startswith("linux"):
        return "systemd"
    if platform == "darwin":
        return "launchd"
    return None


def describe(commands: Sequence[Sequence[str]]) -> str:
    return "\n".join(shlex.join(command) for command in commands)


__all__ = [
    "ENV_FILE_TEMPLATE",
    "LAUNCHD_LABEL",
    "SERVICE_NAME",
    "ServicePlan",
    "describe",
    "install_commands",
    "launchd_plist",
    "manager_for",
    "parse_env_file",
    "service_plan",
    "status_command",
    "systemd_unit",
    "uninstall_commands",
]
