"""`skulk engines install|list`: managed llama.cpp builds for this node.

A thin shell over `skulk.provision`: it resolves paths and the backend, shows progress, and
turns `EngineBuildError` into a one-line reason and exit 1.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated

import typer

from skulk.datadir.paths import resolve_paths
from skulk.provision.llama_build import LLAMA_BACKENDS, BuildPlan, EngineBuildError, build_cache_root, engines_dir

engines_app = typer.Typer(help="Managed engine binaries (llama.cpp's llama-server).", no_args_is_help=True)

EXIT_FAILURE = 1
EXIT_USAGE = 2

DataDir = Annotated[Path | None, typer.Option("--data-dir", envvar="SKULK_HOME", help="Root of this node's data.")]


def _engines_dir(data_dir: Path | None) -> Path:
    return engines_dir(os.environ, resolve_paths(os.environ, sys.platform, Path.home(), data_dir).data_home)


@engines_app.command("install")
def engines_install(
    backend: Annotated[str | None, typer.Option(
        "--backend", help="cpu, cuda, vulkan or metal (default: detected from this machine's GPU).")] = None,
    jobs: Annotated[int, typer.Option("--jobs", "-j", min=1, help="Parallel compile jobs.")] = max(1, (os.cpu_count() or 2)),
    data_dir: DataDir = None,
) -> None:
    """Build llama-server and ggml-rpc-server from the llama.cpp that the installed
    llama-cpp-python vendors (its source distribution, sha256-verified), into this node's
    engines dir. The build cache (~/.cache/skulk/engines/<version>-<backend>) makes a
    second install a copy. SKULK_LLAMA_SERVER_BIN, when set, still overrides what a node uses."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

    from skulk.facts.probe import probe_node_facts
    from skulk.provision.llama_build import detect_backend
    from skulk.provision.llama_install import install_engine, installed_version, resolve_pin

    if backend is not None and backend not in LLAMA_BACKENDS:
        typer.echo(f"skulk: unknown backend {backend!r}; choose one of {', '.join(LLAMA_BACKENDS)}", err=True)
        raise typer.Exit(EXIT_USAGE)
    console = Console(stderr=True)
    try:
        chosen = backend or detect_backend(probe_node_facts())
        version = installed_version()
        plan = BuildPlan(
            pin=resolve_pin(version), backend=chosen,  # type: ignore[arg-type]
            cache_root=build_cache_root(os.environ, Path.home()), engines_dir=_engines_dir(data_dir),
        )
        console.print(f"building llama.cpp {version} ({chosen}) from {plan.pin.filename}; cache {plan.cache_root / plan.key}")
        columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
        with Progress(*columns, console=console) as progress:
            tasks: dict[str, TaskID] = {}

            def report(step: str, done: int, total: int | None) -> None:
                if step not in tasks:
                    tasks[step] = progress.add_task(step, total=total)
                progress.update(tasks[step], completed=done, total=total)

            installed = install_engine(plan, jobs, report)
    except EngineBuildError as exc:
        typer.echo(f"skulk: {exc}", err=True)
        raise typer.Exit(EXIT_FAILURE) from None
    typer.echo(f"installed {installed / 'bin'}")


@engines_app.command("list")
def engines_list(data_dir: DataDir = None) -> None:
    """Managed installs in this node's engines dir, and which llama-server the node uses."""
    from skulk.provision.llama_binary import installed_engines, probe_version
    from skulk.provision.node_engine import resolve_llama_server

    directory = _engines_dir(data_dir)
    installs = installed_engines(directory)
    if not installs:
        typer.echo(f"no managed engines in {directory}; run `skulk engines install`")
    for install in installs:
        answers = probe_version(install.server) or "does not answer --version"
        typer.echo(f"llama.cpp {install.version} {install.backend}: {install.server} ({answers})")
    chosen = resolve_llama_server(os.environ, directory)
    if chosen is None:
        typer.echo("this node uses: no llama-server (the llama_server engine is not advertised)")
    else:
        typer.echo(f"this node uses: {chosen.path} ({chosen.source})")
