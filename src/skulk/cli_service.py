"""`skulk service install|status|uninstall`: run this node as a systemd or launchd service.

A thin shell over `skulk.service.units`: it resolves the data dir and the platform, writes
the definition (and, once, a commented environment file for settings), and runs the service
manager's own commands, printing each. `--dry-run` prints the definition and the commands
and changes nothing.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Annotated

import typer

from skulk.datadir.paths import resolve_paths
from skulk.service.units import (
    ENV_FILE_TEMPLATE,
    ServicePlan,
    describe,
    install_commands,
    launchd_plist,
    manager_for,
    parse_env_file,
    service_plan,
    status_command,
    systemd_unit,
    uninstall_commands,
)

service_app = typer.Typer(help="Run this node as a service (systemd on Linux, launchd on macOS).", no_args_is_help=True)

EXIT_FAILURE = 1
MANAGER_TIMEOUT_S = 60.0

DataDir = Annotated[Path | None, typer.Option("--data-dir", envvar="SKULK_HOME", help="Root of this node's data.")]
UserScope = Annotated[bool, typer.Option("--user", help="A per-user service (systemd --user, a launchd agent).")]


def _plan(data_dir: Path | None, user_scope: bool, run_as: str | None = None) -> ServicePlan:
    manager = manager_for(sys.platform)
    if manager is None:
        typer.echo(f"skulk service: no service manager Skulk writes for on {sys.platform} (systemd, launchd)", err=True)
        raise typer.Exit(EXIT_FAILURE)
    root = resolve_paths(os.environ, sys.platform, Path.home(), data_dir).data_home
    try:
        return service_plan(manager, user_scope=user_scope, python=sys.executable, data_dir=root.resolve(),
                            home=Path.home(), run_as=run_as)
    except ValueError as exc:
        typer.echo(f"skulk service: {exc}", err=True)
        raise typer.Exit(EXIT_FAILURE) from None


def _run(commands: list[list[str]], *, check: bool = True) -> None:
    for command in commands:
        typer.echo(f"$ {describe([command])}")
        try:
            done = subprocess.run(command, timeout=MANAGER_TIMEOUT_S, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            typer.echo(f"skulk service: {command[0]} failed: {exc}", err=True)
            raise typer.Exit(EXIT_FAILURE) from None
        if check and done.returncode != 0:
            typer.echo(f"skulk service: {describe([command])} exited {done.returncode}", err=True)
            raise typer.Exit(EXIT_FAILURE)


@service_app.command("install")
def install(
    user_scope: UserScope = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the definition and the commands; change nothing.")] = False,
    run_as: Annotated[str | None, typer.Option("--run-as", help="Account a system-wide service runs the node as.")] = None,
    data_dir: DataDir = None,
) -> None:
    """Write the service definition for this node, enable it and start it."""
    plan = _plan(data_dir, user_scope, run_as)
    environment = parse_env_file(plan.env_file.read_text()) if plan.env_file.is_file() else {}
    definition = systemd_unit(plan) if plan.manager == "systemd" else launchd_plist(plan, environment).decode()
    commands = install_commands(plan, os.getuid())
    if dry_run:
        typer.echo(f"# {plan.unit_path}\n{definition}")
        typer.echo(f"# settings: {plan.env_file}\n# then:\n{describe(commands)}")
        return
    try:
        plan.data_dir.mkdir(parents=True, exist_ok=True)
        if not plan.env_file.exists():
            plan.env_file.write_text(ENV_FILE_TEMPLATE)
            plan.env_file.chmod(0o600)  # settings may hold keys
        plan.unit_path.parent.mkdir(parents=True, exist_ok=True)
        plan.unit_path.write_text(definition)
    except OSError as exc:
        hint = "" if plan.user_scope else " (a system-wide service needs root: run with sudo, or use --user)"
        typer.echo(f"skulk service: could not write {plan.unit_path}: {exc.strerror}{hint}", err=True)
        raise typer.Exit(EXIT_FAILURE) from None
    typer.echo(f"wrote {plan.unit_path} (settings: {plan.env_file})")
    _run(commands)


@service_app.command("status")
def status(user_scope: UserScope = False, data_dir: DataDir = None) -> None:
    """The service manager's own view of this node's service."""
    plan = _plan(data_dir, user_scope)
    if not plan.unit_path.exists():
        typer.echo(f"not installed: no {plan.unit_path}")
        raise typer.Exit(EXIT_FAILURE)
    _run([status_command(plan, os.getuid())], check=False)


@service_app.command("uninstall")
def uninstall(user_scope: UserScope = False, data_dir: DataDir = None) -> None:
    """Stop and disable the service and remove its definition (the data dir stays)."""
    plan = _plan(data_dir, user_scope)
    if not plan.unit_path.exists():
        typer.echo(f"not installed: no {plan.unit_path}")
        return
    _run(uninstall_commands(plan, os.getuid()), check=False)
    plan.unit_path.unlink()
    typer.echo(f"removed {plan.unit_path}; the data dir {plan.data_dir} is untouched")


__all__ = ["service_app"]
