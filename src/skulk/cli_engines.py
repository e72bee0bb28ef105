"""`skulk engines install|list`: managed llama.cpp builds for this node.

A thin shell over `skulk.provision`: it resolves paths and the backend, shows progress, and
turns `EngineBuildError` into a one-line reason and exit 1.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer

from skulk.datadir.paths import resolve_paths
from skulk.provision.autoprovision import progress_line
from skulk.provision.llama_build import (
    LLAMA_BACKENDS,
    BuildPlan,
    EngineBuildError,
    build_cache_root,
    engine_search_dirs,
    engines_dir,
)

engines_app = typer.Typer(help="Managed engine binaries (llama.cpp's llama-server).", no_args_is_help=True)

EXIT_FAILURE = 1
EXIT_USAGE = 2

DataDir = Annotated[Path | None, typer.Option("--data-dir", envvar="SKULK_HOME", help="Root of this node's data.")]


def _search_dirs(data_dir: Path | None) -> tuple[Path, ...]:
    return engine_search_dirs(os.environ, Path.home(), resolve_paths(os.environ, sys.platform, Path.home(), data_dir).data_home)


@engines_app.command("install")
def engines_install(
    backend: Annotated[str | None, typer.Option(
        "--backend", help="cpu, cuda, vulkan or metal (default: detected from this machine's GPU).")] = None,
    jobs: Annotated[int, typer.Option("--jobs", "-j", min=1, help="Parallel compile jobs.")] = max(1, (os.cpu_count() or 2)),
    wheel: Annotated[bool, typer.Option(
        "--wheel", help="cuda or vulkan: install xllamacpp's prebuilt GPU wheel (llama.cpp's server, served by "
        "the bundled skulk-llama-server) instead of compiling: no compiler or CUDA toolkit needed.")] = False,
    progress_json: Annotated[bool, typer.Option(
        "--progress-json", hidden=True,
        help="Progress as JSON lines on stdout, for a node's background build (it owns this process).")] = False,
) -> None:
    """Build llama-server and ggml-rpc-server from the llama.cpp that the installed
    llama-cpp-python vendors (its source distribution, sha256-verified), into the machine's
    engines dir (SKULK_ENGINES_DIR, else ~/.cache/skulk/engines), which every node here uses
    whatever its --data-dir. The build cache (~/.cache/skulk/engines/<version>-<backend>) makes a
    second install a copy. SKULK_LLAMA_SERVER_BIN, when set, still overrides what a node uses."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

    from skulk.facts.probe import probe_node_facts
    from skulk.provision.llama_build import detect_backend
    from skulk.provision.llama_install import install_engine, installed_version, resolve_pin

    if backend is not None and backend not in LLAMA_BACKENDS:
        typer.echo(f"skulk: unknown backend {backend!r}; choose one of {', '.join(LLAMA_BACKENDS)}", err=True)
        raise typer.Exit(EXIT_USAGE)
    if progress_json:
        owned_by_parent()
    if wheel:
        _install_wheel(backend, progress_json)
        return
    console = Console(stderr=True)
    try:
        chosen = backend or detect_backend(probe_node_facts())
        version = installed_version()
        plan = BuildPlan(
            pin=resolve_pin(version), backend=chosen,  # type: ignore[arg-type]
            cache_root=build_cache_root(os.environ, Path.home()), engines_dir=engines_dir(os.environ, Path.home()),
        )
        console.print(f"building llama.cpp {version} ({chosen}) from {plan.pin.filename}; cache {plan.cache_root / plan.key}")
        if progress_json:
            installed = install_engine(plan, jobs, _json_progress())
        else:
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
    typer.echo(progress_line("done", 0, None) if progress_json else f"installed {installed / 'bin'}")


def _install_wheel(backend: str | None, progress_json: bool) -> None:
    """`--wheel`: xllamacpp's GPU wheel of the running xllamacpp's version, for this
    machine's GPU (its driver's CUDA version), into the machine's engines dir."""
    import json
    import shutil
    import subprocess

    from skulk.facts.nvml import driver_cuda_version
    from skulk.facts.probe import probe_node_facts
    from skulk.provision.gpu_wheel import (
        SITE_DIR,
        WHEEL_BACKENDS,
        WHEEL_KIND,
        cuda_version_of,
        install_command,
        wheel_index,
        wheel_install_dir,
    )
    from skulk.provision.llama_build import MANIFEST_NAME, detect_backend
    from skulk.provision.node_engine import find_bundled_server, xllamacpp_version

    chosen = backend or detect_backend(probe_node_facts())
    version = xllamacpp_version()
    if chosen not in WHEEL_BACKENDS:
        typer.echo(f"skulk: there is no GPU wheel for {chosen}; choose one of {', '.join(WHEEL_BACKENDS)} "
                   "(the CPU and Metal builds are installed with Skulk)", err=True)
        raise typer.Exit(EXIT_USAGE)
    if version is None:
        typer.echo("skulk: xllamacpp is not installed with Skulk on this platform, so there is no version to match",
                   err=True)
        raise typer.Exit(EXIT_FAILURE)
    driver = driver_cuda_version()
    index = wheel_index(chosen, None if driver is None else cuda_version_of(driver))
    if index is None:
        typer.echo(f"skulk: this NVIDIA driver supports CUDA {cuda_version_of(driver or 0)}; the oldest CUDA wheel "
                   "needs 12.8: update the driver, or build with `skulk engines install --backend cuda`", err=True)
        raise typer.Exit(EXIT_FAILURE)
    uv = shutil.which("uv")
    installer = [uv, "pip", "--python", sys.executable] if uv else [sys.executable, "-m", "pip"]
    final = wheel_install_dir(engines_dir(os.environ, Path.home()), version, chosen)
    staging = final.with_name(final.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    command = install_command(installer, staging / SITE_DIR, index, version)
    if progress_json:
        print(progress_line("download", 0, None), flush=True)
    typer.echo(f"installing xllamacpp {version} ({chosen}) from {index}", err=True)
    try:
        done = subprocess.run(command, stdout=sys.stderr, stderr=sys.stderr, timeout=3600, check=False)
    except subprocess.TimeoutExpired:
        done = None
    if done is None or done.returncode != 0:
        shutil.rmtree(staging, ignore_errors=True)
        typer.echo(f"skulk: the wheel install failed: {' '.join(command)}", err=True)
        raise typer.Exit(EXIT_FAILURE)
    (staging / MANIFEST_NAME).write_text(
        json.dumps({"kind": WHEEL_KIND, "version": version, "backend": chosen, "index": index}, indent=2) + "\n",
        encoding="utf-8")
    shutil.rmtree(final, ignore_errors=True)
    staging.rename(final)
    found = find_bundled_server([final.parent])
    if found is None or found.site is None:
        typer.echo(f"skulk: installed {final}, but skulk-llama-server sees no {chosen} device with it "
                   "(driver or device missing): the node keeps the CPU build", err=True)
        raise typer.Exit(EXIT_FAILURE)
    typer.echo(progress_line("done", 0, None) if progress_json else f"installed {final} ({found.backend})")


def _json_progress() -> Callable[[str, int, int | None], None]:
    """A progress callback printing a line only when the step or its whole percent changes:
    a build reports hundreds of steps, the node needs a few dozen lines."""
    last: list[tuple[str, int]] = []

    def report(step: str, done: int, total: int | None) -> None:
        mark = (step, done * 100 // total if total else done)
        if last and last[-1] == mark:
            return
        last[:] = [mark]
        print(progress_line(step, done, total), flush=True)

    return report


def owned_by_parent() -> None:
    """A background build belongs to the node that started it: SIGTERM (the node stopping it)
    unwinds through the compiler's process group, which the installer kills on the way out;
    on Linux the kernel sends that SIGTERM when the node dies, even by SIGKILL."""
    import signal

    def stop(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    if sys.platform.startswith("linux"):
        import ctypes
        import ctypes.util

        parent = os.getppid()
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the owner died before the request took effect
            raise typer.Exit(EXIT_FAILURE)


@engines_app.command("list")
def engines_list(data_dir: DataDir = None) -> None:
    """Managed installs on this machine, and which llama-server a node started here uses."""
    from skulk.provision.llama_binary import installed_engines, probe_version
    from skulk.provision.node_engine import resolve_llama_server

    directories = _search_dirs(data_dir)
    installs = [install for directory in directories for install in installed_engines(directory)]
    if not installs:
        typer.echo(f"no managed engines in {', '.join(str(d) for d in directories)}; "
                   "run `skulk engines install` for a native build")
    for install in installs:
        answers = probe_version(install.server) or "does not answer --version"
        typer.echo(f"llama.cpp {install.version} {install.backend}: {install.server} ({answers})")
    chosen = resolve_llama_server(os.environ, directories)
    if chosen is None:
        typer.echo("this node uses: no llama-server (the llama_server engine is not advertised; "
                   "GGUF is served in-process, one request at a time)")
    else:
        backend = f", {chosen.backend}" if chosen.backend else ""
        typer.echo(f"this node uses: {chosen.path} ({chosen.source}{backend})")
