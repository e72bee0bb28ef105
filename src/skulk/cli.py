"""The `skulk` command line (typer).

`skulk` with no sub-command is `skulk run`. Flags beat environment variables, which beat
`skulk.yaml`, which beats defaults; that merge is the pure `resolve_settings`.
"""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer

from skulk import __version__
from skulk.api.auth import API_KEY_ENV
from skulk.cli_engines import engines_app
from skulk.cli_service import service_app
from skulk.datadir.config import ConfigError, SkulkConfig, load_config, with_env_overrides
from skulk.datadir.paths import SkulkPaths, resolve_paths
from skulk.node import ExitCode, default_node_name, run_node
from skulk.node_settings import NodeSettings
from skulk.provision.llama_build import engine_search_dirs
from skulk.provision.node_engine import export_managed_llama_server
from skulk.routing.joining import join_cluster, joined_peers, read_token
from skulk.shared.settings import setting
from skulk.shared.types.invites import DEFAULT_INVITE_TTL_S, InviteRefused
from skulk.worker.engines.hugepages import export_hugepage_malloc

app = typer.Typer(
    help="Skulk: join machines into one cluster that serves language models.",
    no_args_is_help=False,
    add_completion=False,
)
cluster_app = typer.Typer(help="Cluster-wide settings.", no_args_is_help=True)
models_app = typer.Typer(help="Model cards and downloads.", no_args_is_help=True)
app.add_typer(cluster_app, name="cluster")
app.add_typer(models_app, name="models")
diagnostics_app = typer.Typer(help="Look inside a running cluster.", no_args_is_help=True)
app.add_typer(diagnostics_app, name="diagnostics")
app.add_typer(engines_app, name="engines")
app.add_typer(service_app, name="service")
extensions_app = typer.Typer(help="Installed extensions (plugins): docs/EXTENSIONS.md.", no_args_is_help=True)
app.add_typer(extensions_app, name="extensions")


@dataclass(frozen=True)
class RunFlags:
    """What the operator typed (None = not given); env values are already folded in by typer."""

    api_port: int | None = None
    data_dir: Path | None = None
    listen: str | None = None
    bootstrap_peers: str | None = None
    no_multicast: bool = False
    cluster_key: str | None = None
    no_worker: bool = False
    no_api: bool = False
    node_name: str | None = None
    api_host: str | None = None
    cluster_key_file: Path | None = None
    join: str | None = None
    join_file: Path | None = None


def _split_endpoints(value: str | None) -> tuple[str, ...]:
    if not value:
        return ()
    return tuple(part.strip() for part in value.split(",") if part.strip())


def resolve_settings(
    flags: RunFlags, config: SkulkConfig, paths: SkulkPaths, hostname: str, env_api_key: str | None = None,
    joined_peers: tuple[str, ...] = (),
) -> NodeSettings:
    """Merge flags (with env folded in) over the config file over defaults; the peers a join
    remembered (`joined.json`) come last. Pure."""
    listen = _split_endpoints(flags.listen) or tuple(config.node.listen)
    peers = _split_endpoints(flags.bootstrap_peers) or tuple(config.node.bootstrap_peers) or joined_peers
    return NodeSettings(
        paths=paths,
        node_name=flags.node_name or config.node.name or hostname,
        api_host=flags.api_host or config.api.host,
        api_port=flags.api_port if flags.api_port is not None else config.node.api_port,
        listen=listen,
        bootstrap_peers=peers,
        multicast=config.node.multicast and not flags.no_multicast,
        cluster_key=flags.cluster_key,
        cluster_key_file=flags.cluster_key_file,
        api_key=env_api_key or config.api.api_key,
        operator_key=config.api.operator_key,
        require_key_on_loopback=config.api.require_key_on_loopback,
        open_to_lan=config.api.open_to_lan,
        allowed_hosts=tuple(config.api.allowed_hosts),
        local_model_dirs=tuple(Path(d).expanduser() for d in config.models.local_dirs),
        kv_cache_type=config.kv_cache_backend,
        cors_origins=tuple(config.api.cors_origins),
        api_enabled=not flags.no_api,
        api_max_body_bytes=config.api.max_body_bytes,
        worker_enabled=not flags.no_worker,
        model_store=config.model_store,
        tracing=config.tracing,
        logging=config.logging,
        event_log=config.event_log,
        telemetry=config.telemetry,
    )


def _paths(data_dir: Path | None) -> SkulkPaths:
    return resolve_paths(os.environ, sys.platform, Path.home(), data_dir)


def _configure_logging() -> None:
    logging.basicConfig(
        level=(setting("SKULK_LOG_LEVEL") or "INFO").upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    # One line per request from our own peer probes is noise, not an operator event.
    logging.getLogger("httpx").setLevel(logging.WARNING)


ApiPort = Annotated[int | None, typer.Option("--api-port", envvar="SKULK_API_PORT", help="HTTP port (default 52415).")]
DataDir = Annotated[Path | None, typer.Option("--data-dir", envvar="SKULK_HOME", help="Root of this node's data.")]
Listen = Annotated[str | None, typer.Option("--listen", envvar="SKULK_LISTEN", help="Transport endpoint(s), e.g. tcp/127.0.0.1:7447.")]
Peers = Annotated[str | None, typer.Option("--bootstrap-peers", envvar="SKULK_BOOTSTRAP_PEERS", help="Comma-separated peer endpoints.")]
NoMulticast = Annotated[bool, typer.Option("--no-multicast", help="Disable LAN multicast scouting.")]
ClusterKey = Annotated[str | None, typer.Option("--cluster-key", envvar="SKULK_CLUSTER_KEY", help="Shared cluster secret.")]
NoWorker = Annotated[bool, typer.Option("--no-worker", help="Run without the worker.")]
NoApi = Annotated[bool, typer.Option("--no-api", help="Run without the HTTP API.")]
NodeName = Annotated[str | None, typer.Option("--node-name", help="Friendly name shown in state and dashboard.")]
ClusterKeyFile = Annotated[Path | None, typer.Option(
    "--cluster-key-file", envvar="SKULK_CLUSTER_KEY_FILE",
    help="File holding the shared cluster secret (keeps it out of `ps`).")]
ApiHost = Annotated[str | None, typer.Option("--api-host", envvar="SKULK_API_HOST", help="Address the API binds (default 0.0.0.0).")]
Join = Annotated[str | None, typer.Option(
    "--join", envvar="SKULK_JOIN_TOKEN",
    help="Join a cluster with a token from `skulk cluster invite` (- reads it from stdin); the key is then kept.")]
JoinFile = Annotated[Path | None, typer.Option("--join-file", help="File holding a join token (keeps it out of `ps`).")]


KEY_ON_COMMAND_LINE_WARNING = (
    "--cluster-key on the command line is visible to every local user in `ps`; "
    "use --cluster-key-file or SKULK_CLUSTER_KEY instead.")


def key_on_command_line(argv: list[str]) -> bool:
    """Whether the cluster key was typed as a flag (the env variable is not visible in `ps`)."""
    return any(arg == "--cluster-key" or arg.startswith("--cluster-key=") for arg in argv)


def _join_if_asked(flags: RunFlags, paths: SkulkPaths, node_name: str) -> None:
    """Redeem a join token before the node starts (`skulk.routing.joining`); a refused one
    ends the command with its reason (exit 2) and changes nothing."""
    log = logging.getLogger("skulk.cli")
    try:
        token = read_token(flags.join, flags.join_file, sys.stdin.read)
        if token is None:
            return
        if flags.cluster_key or flags.cluster_key_file:
            raise InviteRefused("conflict", "--join brings the cluster key; do not give --cluster-key "
                                            "or --cluster-key-file (or their environment variables) with it")
        join_cluster(token, paths.data_home, node_name)
    except InviteRefused as exc:
        log.error("cannot join: %s (%s)", exc.message, exc.reason)
        raise typer.Exit(ExitCode.USAGE) from None


def _run(flags: RunFlags) -> None:
    _configure_logging()
    if key_on_command_line(sys.argv[1:]):
        logging.getLogger("skulk.cli").warning(KEY_ON_COMMAND_LINE_WARNING)
    paths = _paths(flags.data_dir)
    try:
        config = with_env_overrides(load_config(paths.config_file), os.environ)
    except ConfigError as exc:
        typer.echo(f"skulk: {exc}", err=True)
        raise typer.Exit(ExitCode.USAGE) from None
    node_name = flags.node_name or config.node.name or default_node_name()
    _join_if_asked(flags, paths, node_name)
    settings = resolve_settings(flags, config, paths, default_node_name(), setting(API_KEY_ENV) or None,
                                joined_peers(paths.data_home))
    export_managed_llama_server(  # before the probe reads it
        os.environ, engine_search_dirs(os.environ, Path.home(), paths.data_home))
    export_hugepage_malloc(os.environ)  # before any engine process starts: glibc reads it at process start
    raise typer.Exit(run_node(settings))


@app.callback(invoke_without_command=True)
def default(
    ctx: typer.Context,
    api_port: ApiPort = None,
    data_dir: DataDir = None,
    listen: Listen = None,
    bootstrap_peers: Peers = None,
    no_multicast: NoMulticast = False,
    cluster_key: ClusterKey = None,
    no_worker: NoWorker = False,
    no_api: NoApi = False,
    node_name: NodeName = None,
    api_host: ApiHost = None,
    cluster_key_file: ClusterKeyFile = None,
    join: Join = None,
    join_file: JoinFile = None,
    version: Annotated[bool, typer.Option("--version", help="Print the version and exit.")] = False,
) -> None:
    """With no sub-command, run a node (same flags as `skulk run`)."""
    if version:
        typer.echo(f"skulk {__version__}")
        raise typer.Exit(0)
    if ctx.invoked_subcommand is None:
        _run(RunFlags(api_port, data_dir, listen, bootstrap_peers, no_multicast, cluster_key, no_worker, no_api, node_name,
                      api_host, cluster_key_file, join, join_file))


@app.command()
def run(
    api_port: ApiPort = None,
    data_dir: DataDir = None,
    listen: Listen = None,
    bootstrap_peers: Peers = None,
    no_multicast: NoMulticast = False,
    cluster_key: ClusterKey = None,
    no_worker: NoWorker = False,
    no_api: NoApi = False,
    node_name: NodeName = None,
    api_host: ApiHost = None,
    cluster_key_file: ClusterKeyFile = None,
    join: Join = None,
    join_file: JoinFile = None,
) -> None:
    """Run a node: router, election, master, worker and API in one process."""
    _run(RunFlags(api_port, data_dir, listen, bootstrap_peers, no_multicast, cluster_key, no_worker, no_api, node_name,
                  api_host, cluster_key_file, join, join_file))


@app.command("api-key")
def api_key(data_dir: DataDir = None) -> None:
    """Print this node's API key (creating it in the data dir on first use).

    Clients on other machines send it as `Authorization: Bearer KEY`; clients on the node's
    own machine need none unless api.require_key_on_loopback is set."""
    from skulk.api.node_access import load_or_create_api_key
    from skulk.datadir.secret_file import SecretFileError

    paths = _paths(data_dir)
    try:
        config = with_env_overrides(load_config(paths.config_file), os.environ)
        typer.echo(setting(API_KEY_ENV) or config.api.api_key or load_or_create_api_key(paths))
    except (ConfigError, SecretFileError) as exc:
        typer.echo(f"skulk: {exc}", err=True)
        raise typer.Exit(ExitCode.USAGE) from None


@cluster_app.command("key")
def cluster_key(data_dir: DataDir = None, cluster_key: ClusterKey = None,
                cluster_key_file: ClusterKeyFile = None) -> None:
    """Print the cluster key (creating it in the data dir on first use).

    Give it to other nodes as `--cluster-key` or `SKULK_CLUSTER_KEY` so they can join."""
    from skulk.routing.cluster_key import ClusterKeyError, resolve_cluster_key

    paths = _paths(data_dir)
    paths.data_home.mkdir(parents=True, exist_ok=True)
    try:
        typer.echo(resolve_cluster_key(cluster_key, paths.data_home, cluster_key_file))
    except ClusterKeyError as exc:
        typer.echo(f"skulk: {exc}", err=True)
        raise typer.Exit(ExitCode.USAGE) from None


def parse_duration(text: str) -> float:
    """`90`, `90s`, `15m`, `2h` -> seconds; ValueError otherwise. Pure."""
    text = text.strip().lower()
    units = {"s": 1.0, "m": 60.0, "h": 3600.0}
    scale = units.get(text[-1:])
    number = text[:-1] if scale is not None else text
    value = float(number) * (scale or 1.0)
    if not value > 0:
        raise ValueError(f"not a positive duration: {text!r}")
    return value


@cluster_app.command("invite")
def cluster_invite(
    url: Annotated[str, typer.Option("--url", envvar="SKULK_URL", help="The inviting node's API.")] = "http://localhost:52415",
    expires: Annotated[str, typer.Option("--expires", help="How long the token is valid: 90s, 15m, 2h (at most 24h).")]
    = f"{int(DEFAULT_INVITE_TTL_S // 60)}m",
) -> None:
    """Print a single-use, expiring join token (its last line) for a new machine:
    `skulk run --join TOKEN` there (or --join-file, or --join - from stdin) joins with no key typed.

    The key comes from SKULK_API_KEY when the node is not on this machine."""
    from skulk.client.http import NodeClient
    from skulk.client.views import ClientError

    try:
        ttl_s = parse_duration(expires)
    except ValueError as exc:
        typer.echo(f"skulk: --expires: {exc}", err=True)
        raise typer.Exit(ExitCode.USAGE) from None
    try:
        with NodeClient(url, setting(API_KEY_ENV) or None) as client:
            issued = client.post("/v1/cluster/invites", {"ttlSeconds": ttl_s})
    except ClientError as exc:
        typer.echo(f"skulk: {exc}", err=True)
        raise typer.Exit(ExitCode.FAILURE) from None
    from datetime import UTC, datetime
    expiry = datetime.fromtimestamp(issued["expiresAt"], UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    typer.echo(f"invite {issued['inviteId']}: one machine may join until {expiry}")
    typer.echo(f"  redeemed at: {', '.join(issued['apiEndpoints'])}")
    typer.echo(f"  bootstrap peers: {', '.join(issued['peers']) or 'none (multicast only)'}")
    typer.echo("on the new machine run `skulk run --join TOKEN`, or keep it out of `ps` with "
               "`skulk run --join-file FILE` or `skulk run --join -` (stdin). The token:")
    typer.echo(issued["token"])


@app.command()
def doctor(
    data_dir: DataDir = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print machine-readable results.")] = False,
    fix: Annotated[bool, typer.Option("--fix", help="Apply the safe idempotent fixes, then re-check.")] = False,
) -> None:
    """Check this node's environment: engines, conflicts, storage, dashboard, cluster key, lease.

    Exits non-zero when any check is an error."""
    import json

    from skulk.facts.doctor import apply_fixes, gather_doctor_inputs, has_errors, run_checks

    paths = _paths(data_dir)
    try:
        reserve = int(with_env_overrides(load_config(paths.config_file), os.environ).model_store.disk_reserve_gb * 1024**3)
    except ConfigError as exc:
        typer.echo(f"skulk: {exc}", err=True)
        raise typer.Exit(ExitCode.USAGE) from None
    results = run_checks(gather_doctor_inputs(paths, os.environ, disk_reserve_bytes=reserve))
    applied: list[str] = []
    if fix:
        applied = apply_fixes(results, paths)
        if applied:
            results = run_checks(gather_doctor_inputs(paths, os.environ, disk_reserve_bytes=reserve))
    failed = has_errors(results)
    if as_json:
        typer.echo(json.dumps({"ok": not failed, "fixed": applied, "results": [r.as_json() for r in results]}, indent=2))
    else:
        _print_doctor(results, applied)
    raise typer.Exit(ExitCode.FAILURE if failed else ExitCode.OK)


def _print_doctor(results: list, applied: list[str]) -> None:
    from rich.console import Console
    from rich.table import Table

    style = {"ok": "green", "warn": "yellow", "error": "red"}
    table = Table("check", "status", "finding")
    for result in results:
        verdict = result.verdict
        table.add_row(result.title, f"[{style[verdict.status]}]{verdict.status}[/]", verdict.message)
    console = Console()
    console.print(table)
    for result in results:
        verdict = result.verdict
        if verdict.status == "ok":
            continue
        console.print(f"[{style[verdict.status]}]{result.title}[/]: {verdict.message}")
        if verdict.consequence:
            console.print(f"  consequence: {verdict.consequence}")
        if verdict.remediation:
            console.print(f"  fix: {verdict.remediation}" + (" (applied by --fix)" if verdict.fixable else ""))
    if applied:
        console.print(f"applied fixes: {', '.join(applied)}")


@models_app.command("list")
def models_list(data_dir: DataDir = None) -> None:
    """List the model cards this node knows (built-in and custom)."""
    from rich.console import Console
    from rich.table import Table

    from skulk.models.cards import builtin_cards_dir, resolve_cards

    paths = _paths(data_dir)
    card_set = resolve_cards(builtin_cards_dir(), paths.custom_cards_dir)
    from skulk.artifacts.plan import Route, route_for
    from skulk.models.downloads import local_artifact

    table = Table("model", "family", "layers", "context", "size", "engines", "source", "downloaded")
    for model_id in sorted(card_set.cards):
        card = card_set.cards[model_id]
        origin = "custom" if model_id in card_set.custom_ids else "built-in"
        if route_for(card, store_bound=False) is not Route.HUB:
            downloaded = "local"  # generated on first use, or read in place
        else:
            downloaded = "yes" if local_artifact(card, paths.models_dir) is not None else "no"
        table.add_row(
            model_id, card.family, str(card.num_layers), str(card.context_length),
            f"{card.storage_size_bytes / 1e9:.2f} GB", ", ".join(sorted(card.engines)), origin, downloaded,
        )
    console = Console()
    console.print(table)
    for error in card_set.errors:
        console.print(f"[red]{error}[/red]")
    if card_set.errors:
        raise typer.Exit(ExitCode.USAGE)


@models_app.command("pull")
def models_pull(
    model_id: Annotated[str, typer.Argument(help="Model id of a built-in or custom card (mlx-community/Llama-3.2-1B-Instruct-4bit), "
                                                 "a Hugging Face repo (owner/repo[:QUANT]) or an Ollama name (llama3.2:1b).")],
    data_dir: DataDir = None,
) -> None:
    """Download a model's weights into this node's models dir, with a progress bar.

    Hugging Face cards download through HF_ENDPOINT (default huggingface.co) with HF_TOKEN
    for private or gated repos; local cards are generated or checked in place. A repo or an
    Ollama library name without a card gets one built from the hub's metadata for the
    download (add it to the cluster with `skulk models add`). Exits 1 with the reason when
    the download fails, 2 when the name is no card, repo or library name."""
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn

    from skulk.artifacts.plan import Route, route_for
    from skulk.artifacts.resolve import pull_model
    from skulk.models.artifact_errors import ArtifactUnavailable
    from skulk.models.cards import builtin_cards_dir, resolve_cards
    from skulk.shared.types.ids import ModelId

    _configure_logging()
    for noisy in ("huggingface_hub", "httpx2"):  # one line per request; our bar and errors say it
        logging.getLogger(noisy).setLevel(logging.ERROR)
    paths = _paths(data_dir)
    cards = resolve_cards(builtin_cards_dir(), paths.custom_cards_dir).cards
    card = cards.get(ModelId(model_id))
    if card is None:
        card = _card_for_name(model_id, frozenset(cards))
        model_id = card.model_id
    try:  # the same disk reserve the node keeps (skulk.yaml, then SKULK_DISK_RESERVE_GB)
        store_section = with_env_overrides(load_config(paths.config_file), os.environ).model_store
    except ConfigError as exc:
        typer.echo(f"skulk: {exc}", err=True)
        raise typer.Exit(ExitCode.USAGE) from None
    reserve_bytes = int(store_section.disk_reserve_gb * 1024**3)
    console = Console(stderr=True)
    try:
        if route_for(card, store_bound=False) is not Route.HUB:
            pulled = pull_model(card, paths.models_dir)
        else:
            columns = (TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                       TimeRemainingColumn())
            with Progress(*columns, console=console, transient=False) as progress:
                def bar(which):
                    task = progress.add_task(which.model_id, total=None)
                    return lambda done, total: progress.update(task, completed=done, total=total)

                # Companion repos too, as the worker does: a required one failing fails the pull.
                pulled = pull_model(card, paths.models_dir, progress_for=bar, reserve_bytes=reserve_bytes)
    except ArtifactUnavailable as exc:  # DownloadFailed included: the reason is the message
        typer.echo(f"skulk: {exc}", err=True)
        raise typer.Exit(ExitCode.FAILURE) from None
    typer.echo(f"{model_id}: {pulled.path}")
    for repo_id, companion_path in pulled.companions.items():
        typer.echo(f"{model_id} companion {repo_id}: {companion_path}")


def _card_for_name(typed: str, card_ids: frozenset[str]):
    """The card a typed repo or Ollama library name stands for, built from the hub (exit 2
    naming what is known when the name is none, 1 when the hub cannot build it)."""
    from skulk.models import hub_meta
    from skulk.models.card_builder import CardBuildError
    from skulk.models.downloads import HubSource
    from skulk.models.hub_cards import card_from_hub
    from skulk.models.hub_files import SelectionError
    from skulk.models.model_names import UnknownModelName, load_library, resolve_model_name

    try:
        resolved = resolve_model_name(typed, card_ids, load_library())
    except UnknownModelName as exc:
        typer.echo(f"skulk: {exc}; see `skulk models list`", err=True)
        raise typer.Exit(ExitCode.USAGE) from None
    try:
        card = card_from_hub(resolved.model_id, HubSource.from_env(), quant=resolved.quant)
    except (hub_meta.HubError, CardBuildError, SelectionError) as exc:
        typer.echo(f"skulk: {typed}: {exc}", err=True)
        raise typer.Exit(ExitCode.FAILURE) from None
    typer.echo(f"{typed}: {card.model_id} {card.gguf_file or ''}".rstrip(), err=True)
    return card


@models_app.command("rm")
def models_rm(
    model_id: Annotated[str, typer.Argument(help="Model id whose downloaded weights to delete.")],
    data_dir: DataDir = None,
) -> None:
    """Delete a model's downloaded weights from this node (every revision). The card stays;
    the next use downloads again. Exits 1 when there was nothing to delete."""
    from skulk.models.downloads import remove_model

    paths = _paths(data_dir)
    removed = remove_model(paths.models_dir, model_id)
    if not removed:
        typer.echo(f"skulk: no local copy of {model_id} in {paths.models_dir}", err=True)
        raise typer.Exit(ExitCode.FAILURE)
    for path in removed:
        typer.echo(f"removed {path}")


@diagnostics_app.command("capture")
def diagnostics_capture(
    output: Annotated[Path | None, typer.Option("-o", "--output", help="Archive to write (default ./skulk-capture-<time>.tar.gz).")] = None,
    url: Annotated[str, typer.Option("--url", envvar="SKULK_URL", help="A node's API.")] = "http://localhost:52415",
) -> None:
    """Write one archive with every node's flight recorder, diagnostics, recent logs, config
    (secrets redacted) and versions, plus State; unreachable nodes are listed as such.

    The key comes from SKULK_API_KEY. Exits 1 when the asked node does not answer."""
    from datetime import UTC, datetime

    from skulk.observe.capture import CaptureFailed, capture_files, fetch_capture_inputs, write_archive

    created = datetime.now(UTC)
    try:
        report, state, summary = fetch_capture_inputs(url, setting(API_KEY_ENV) or None)
    except CaptureFailed as exc:
        typer.echo(f"skulk: capture failed: {exc}", err=True)
        raise typer.Exit(ExitCode.FAILURE) from None
    path = output or Path(f"skulk-capture-{created.strftime('%Y%m%dT%H%M%SZ')}.tar.gz")
    write_archive(capture_files(report, state, summary, asked_url=url, created_at=created), path)
    nodes = report.get("nodes") or {}
    typer.echo(f"{path}: {len(nodes)} nodes, {len(report.get('unreachable') or [])} unreachable")
    for node_id in report.get("unreachable") or []:
        typer.echo(f"  unreachable: {node_id} ({nodes.get(node_id, {}).get('error')})")
@extensions_app.command("list")
def extensions_list(
    url: Annotated[str | None, typer.Option(
        "--url", help="Ask a running node's API (its /v1/diagnostics/node, with hook counters) instead of "
        "discovering here.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the diagnostics' extensions section as JSON.")] = False,
) -> None:
    """The extensions a node loads (name, version, hooks, failure policy) and the ones it skips, with why.

    Without --url, discovery runs here as a node started in this environment would run it
    (SKULK_EXTENSIONS_DISABLE included). The key for --url comes from SKULK_API_KEY."""
    import json

    from skulk.extensions.report import discovery_report, report_lines

    if url is None:
        from skulk.extensions.loader import load_extensions

        section = discovery_report(load_extensions())
    else:
        from skulk.client.http import ClientError, NodeClient

        try:
            with NodeClient(url, setting(API_KEY_ENV) or None) as client:
                section = client.get("/v1/diagnostics/node").get("extensions") or {}
        except ClientError as exc:
            typer.echo(f"skulk: {exc}", err=True)
            raise typer.Exit(ExitCode.FAILURE) from None
    if as_json:
        typer.echo(json.dumps(section, indent=2))
        return
    for line in report_lines(section):
        typer.echo(line)


from skulk.client.commands import register as _register_client_commands  # noqa: E402 - after the app's own

_register_client_commands(app, models_app)


def main() -> None:
    app()
