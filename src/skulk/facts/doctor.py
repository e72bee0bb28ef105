"""The node doctor: the node's environment contract, executable on demand.

A check registry (`CHECKS`, in report order) runs pure functions over one `DoctorInputs`
snapshot: the same NodeFacts and derived backends the capability pipeline advertises, plus
the state of the node's paths, dashboard assets, cluster key and data-dir lease. Each check
returns one or more `Verdict`s; every non-OK verdict states its consequence for serving and
the exact remediation, and says whether `skulk doctor --fix` can apply it.

`gather_doctor_inputs` is the impure shell that observes; `apply_fixes` applies only the safe,
idempotent remediations (create the node's directories, create the cluster key, tighten the
key file's permissions). Checks must never touch the disk, the clock or the environment, and
this module must never print or log a cluster key.
"""

from __future__ import annotations

import os
import shutil
import socket
import stat
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from skulk.dashboard import DASHBOARD_DIR_ENV, INDEX_NAME
from skulk.dashboard import dashboard_dir as resolve_dashboard_dir
from skulk.datadir.lease import Held, LeaseRecord, lease_decision, pid_alive, read_lease
from skulk.datadir.paths import SkulkPaths
from skulk.extensions.loader import DISABLE_ENV, ExtensionSet
from skulk.facts.derive import DerivedBackends, derive_node_backends
from skulk.provision.autoprovision import BuildInBackground, NoBuild
from skulk.shared.settings import setting
from skulk.shared.types.node_facts import NodeFacts

Status = Literal["ok", "warn", "error"]

STORAGE_RESERVE_BYTES = 10 * 1024**3
"""The default reserve (`model_store.disk_reserve_gb`): downloads refuse to eat into it, so
below it on the models volume every download is refused: a warning. The node's configured
reserve (skulk.yaml, SKULK_DISK_RESERVE_GB) replaces it in `DoctorInputs.disk_reserve_bytes`."""

STORAGE_ERROR_BYTES = 2 * 1024**3
"""Below this, even a small model or the event log's growth can fill the disk: an error."""


CLUSTER_KEY_ENV = "SKULK_CLUSTER_KEY"

FIX_STORAGE = "create_dirs"
FIX_CLUSTER_KEY = "create_cluster_key"
FIX_KEY_PERMISSIONS = "chmod_cluster_key"
FIX_ENGINE_BUILD = "install_engine"


# -- the snapshot -----------------------------------------------------------------------------


@dataclass(frozen=True)
class PathState:
    path: Path
    exists: bool
    writable: bool
    """Writable if it exists, else creatable (its nearest existing ancestor is writable)."""
    free_bytes: int | None
    """Free space on its volume (of the nearest existing ancestor); None if unreadable."""


@dataclass(frozen=True)
class ClusterKeyState:
    path: Path
    from_env: bool
    """SKULK_CLUSTER_KEY is set (non-empty): it wins over the file."""
    exists: bool
    mode: int | None = None
    empty: bool = False


@dataclass(frozen=True)
class LeaseState:
    path: Path
    holder: LeaseRecord | None
    held: bool
    """A live, unexpired holder (`lease_decision` says Held)."""


@dataclass(frozen=True)
class DoctorInputs:
    facts: NodeFacts
    backends: DerivedBackends
    data_home: PathState
    models_dir: PathState
    dashboard_dir: Path
    dashboard_assets_present: bool
    cluster_key: ClusterKeyState
    lease: LeaseState
    disk_reserve_bytes: int = STORAGE_RESERVE_BYTES
    """The free space downloads must leave on the models volume (the node's configuration)."""
    engine_build: BuildInBackground | NoBuild | None = None
    """What a node started here decides about a background native llama-server build."""
    engine_build_running: bool = False
    """An install holds the machine's install lock now (a node's background build, or
    `skulk engines install`)."""
    extensions: ExtensionSet = ExtensionSet()
    """What a node started here would find in the `skulk.extensions` entry points."""


# -- verdicts and the registry ----------------------------------------------------------------


@dataclass(frozen=True)
class Verdict:
    status: Status
    message: str
    consequence: str = ""
    """What this means for serving (empty when OK)."""
    remediation: str = ""
    """The exact fix (empty when OK)."""
    fix: str | None = None
    """Id of the safe fix `--fix` applies, None when it needs a human."""

    @property
    def fixable(self) -> bool:
        return self.fix is not None


def ok(message: str) -> Verdict:
    return Verdict("ok", message)


@dataclass(frozen=True)
class Check:
    id: str
    title: str
    run: Callable[[DoctorInputs], Sequence[Verdict]]


@dataclass(frozen=True)
class CheckResult:
    check_id: str
    title: str
    verdict: Verdict

    def as_json(self) -> dict[str, Any]:
        return {
            "check": self.check_id,
            "title": self.title,
            **asdict(self.verdict),
            "fixable": self.verdict.fixable,
        }


def check_engines(inputs: DoctorInputs) -> list[Verdict]:
    """Which engines import and which backend tags result; an error when none can load."""
    importable = inputs.facts.importable
    engines = ", ".join(f"{name} {'imports' if importable.get(name) else 'missing'}" for name in ("llama_cpp", "mlx", "mlx_lm"))
    server = inputs.facts.engine_binaries.get("llama_server")
    engines += (
        "; llama-server: none (`skulk engines install` builds one)" if server is None
        else f"; llama-server {server.path}: {server.state}"
        + (f" ({server.version}{', ' + server.backend + ' build' if server.backend else ''})" if server.version else "")
    )
    if not inputs.backends.tags:
        return [
            Verdict(
                "error",
                f"no engine can load ({engines}); the node advertises no backends",
                consequence="this node joins the cluster but no model can be placed on it",
                remediation="reinstall Skulk's dependencies (`uv sync`: llama-cpp-python, mlx and mlx-lm are core "
                "dependencies), or point SKULK_LLAMA_SERVER_BIN at a llama-server binary",
            )
        ]
    return [ok(f"{engines}; advertises {', '.join(inputs.backends.tags)}")]


def check_engine_build(inputs: DoctorInputs) -> list[Verdict]:
    """A native llama-server build for this machine's compute exists, or a node builds one in the background (`--fix` builds it now)."""
    decision = inputs.engine_build
    if inputs.engine_build_running:
        return [ok("a native llama-server build is running on this machine (a node's background build, or "
                   "`skulk engines install`); each node's /state shows its progress under engineProvision")]
    if decision is None:
        return [ok("not judged")]
    if isinstance(decision, BuildInBackground):
        return [Verdict(
            "warn", f"no native llama-server build for {decision.backend} on this machine",
            consequence="GGUF is served by the bundled llama-server (generic CPU code, or the wheel's GPU build) until "
            "a node started here finishes building one in the background (5 to 30 minutes, lowest CPU priority)",
            remediation="wait for the node's background build, or run `skulk engines install` (or `skulk doctor "
            "--fix`) now; SKULK_NO_ENGINE_AUTOPROVISION=1 keeps the bundled server",
            fix=FIX_ENGINE_BUILD,
        )]
    if decision.shown is not None:
        return [Verdict("warn", decision.shown.message,
                        consequence="new GGUF placements keep the bundled llama-server",
                        remediation=decision.shown.message)]
    return [ok(f"no background build: {decision.reason}")]


_LEVEL_STATUS: Mapping[str, Status] = {"error": "error", "warn": "warn", "info": "ok"}


def check_capability_conflicts(inputs: DoctorInputs) -> list[Verdict]:
    """Every CapabilityConflict derived from the facts, at its own level."""
    if not inputs.backends.conflicts:
        return [ok("detected hardware and declarations agree")]
    return [
        Verdict(
            _LEVEL_STATUS.get(conflict.level, "warn"),
            f"[{conflict.code}] {conflict.message}",
            consequence="the node's advertised backends differ from what its hardware could serve",
            remediation=conflict.remediation or "",
        )
        for conflict in inputs.backends.conflicts
    ]


def _dir_verdicts(state: PathState, what: str, *, unwritable: tuple[str, str], missing: tuple[str, str, str]) -> list[Verdict]:
    """One directory's verdict: an error when it is not writable, a warning (fixable by
    `skulk doctor --fix`) when it does not exist yet, else ok. `unwritable`: the
    consequence and the remediation's alternative; `missing`: its wording, consequence and
    remediation."""
    if not state.writable:
        consequence, alternative = unwritable
        return [
            Verdict(
                "error",
                f"{what} {state.path} is not writable",
                consequence=consequence,
                remediation=f"fix ownership (`chown -R $USER {state.path}`) or {alternative}",
            )
        ]
    if not state.exists:
        wording, consequence, remediation = missing
        return [
            Verdict("warn", f"{what} {state.path} {wording}", consequence=consequence, remediation=remediation,
                    fix=FIX_STORAGE)
        ]
    return [ok(f"{what} {state.path} exists and is writable")]


def check_data_dir(inputs: DoctorInputs) -> list[Verdict]:
    """The data dir exists and is writable."""
    return _dir_verdicts(
        inputs.data_home, "data dir",
        unwritable=("the node cannot take its lease, write its event log or keep a cluster key; it will not start",
                    "pass another --data-dir"),
        missing=("does not exist yet", "nothing is lost: the first start creates it",
                 "run `skulk doctor --fix` (or start the node once)"),
    )


def check_models_dir(inputs: DoctorInputs) -> list[Verdict]:
    """The models dir exists and is writable."""
    return _dir_verdicts(
        inputs.models_dir, "models dir",
        unwritable=("model downloads fail; only models already on disk can be served",
                    "set SKULK_MODELS_DIR to a writable path"),
        missing=("does not exist", "no model is stored on this node yet; downloads create it",
                 "run `skulk doctor --fix` to create it now"),
    )


def check_storage_headroom(inputs: DoctorInputs) -> list[Verdict]:
    """Free space for models: a warning under the configured download reserve, an error under 2 GiB."""
    state = inputs.models_dir
    if state.free_bytes is None:
        return [Verdict("warn", f"free space on {state.path} is unreadable", consequence="downloads may fill the disk unnoticed", remediation="check the volume with `df -h`")]
    free_gib = state.free_bytes / 1024**3
    where = f"{free_gib:.1f} GiB free for models at {state.path}"
    if state.free_bytes < STORAGE_ERROR_BYTES:
        return [
            Verdict(
                "error",
                f"only {where} (< {STORAGE_ERROR_BYTES // 1024**3} GiB)",
                consequence="model downloads and the event log will fail with a full disk",
                remediation="free disk space, or set SKULK_MODELS_DIR to a larger volume",
            )
        ]
    if state.free_bytes < inputs.disk_reserve_bytes:
        return [
            Verdict(
                "warn",
                f"only {where} (< {inputs.disk_reserve_bytes / 1024**3:g} GiB download reserve)",
                consequence="every model download is refused until the reserve is free (downloads never eat into it)",
                remediation="free disk space, set SKULK_MODELS_DIR to a larger volume, "
                            "or lower model_store.disk_reserve_gb (SKULK_DISK_RESERVE_GB)",
            )
        ]
    return [ok(where)]


def check_dashboard(inputs: DoctorInputs) -> list[Verdict]:
    """Built dashboard assets are present; a warning (headless node) when not."""
    if inputs.dashboard_assets_present:
        return [ok(f"dashboard assets found in {inputs.dashboard_dir}")]
    return [
        Verdict(
            "warn",
            f"no dashboard files in {inputs.dashboard_dir}: headless node",
            consequence="the API serves normally but the browser dashboard is unavailable on this node",
            remediation=f"reinstall skulk (it ships the dashboard), or point {DASHBOARD_DIR_ENV} at a copy of its files",
        )
    ]


def check_cluster_key(inputs: DoctorInputs) -> list[Verdict]:
    """A cluster key is given or on disk, non-empty, and readable only by its owner (0600)."""
    key = inputs.cluster_key
    if key.from_env:
        return [ok(f"cluster key given by {CLUSTER_KEY_ENV} (it wins over {key.path})")]
    if not key.exists:
        return [
            Verdict(
                "warn",
                f"no cluster key at {key.path}",
                consequence="the first start creates one; other nodes cannot join until you share it",
                remediation="run `skulk doctor --fix` (or `skulk cluster key`) and give the key to the other nodes",
                fix=FIX_CLUSTER_KEY,
            )
        ]
    if key.empty:
        return [
            Verdict(
                "error",
                f"cluster key file {key.path} is empty",
                consequence="the node refuses to start rather than silently leave its cluster",
                remediation=f"write the cluster's key into {key.path}, or delete it to create a new cluster",
            )
        ]
    if key.mode is not None and key.mode & (stat.S_IRWXG | stat.S_IRWXO):
        return [
            Verdict(
                "warn",
                f"cluster key file {key.path} is readable by other users (mode {key.mode & 0o777:o})",
                consequence="any local user can read the key and join or decrypt the cluster's traffic",
                remediation=f"chmod 600 {key.path} (`skulk doctor --fix` does it)",
                fix=FIX_KEY_PERMISSIONS,
            )
        ]
    return [ok(f"cluster key present at {key.path} (mode 600)")]


def check_lease(inputs: DoctorInputs) -> list[Verdict]:
    """Who holds the data-dir lease: a running node, a stale record, or nobody."""
    lease = inputs.lease
    if lease.holder is None:
        return [ok("no node holds this data dir")]
    if lease.held:
        return [ok(f"held by a running node: {lease.holder.describe()}")]
    return [ok(f"stale lease of {lease.holder.describe()}; the next start takes it over")]


def check_extensions(inputs: DoctorInputs) -> list[Verdict]:
    """Installed extensions (the `skulk.extensions` entry points): each one a node started here would load, and each one it would skip with the reason (never fatal: the node serves without it)."""
    found = inputs.extensions
    if found.disabled:
        return [ok(f"discovery is off ({DISABLE_ENV} is set): no extension runs")]
    if not found.loaded and not found.skipped:
        return [ok("none installed")]
    verdicts = [ok(f"{ext.shape.name} {ext.shape.version} loads from {ext.entry_point} "
                   f"(hooks: {', '.join(ext.shape.hooks) or 'none'}; on failure: {ext.shape.failure_policy})")
                for ext in found.loaded]
    verdicts.extend(Verdict(
        "warn", f"{skipped.name or skipped.entry_point} is skipped: {skipped.reason}",
        consequence="its hooks do not run on this node (the node serves without it)",
        remediation=f"upgrade or reinstall the extension ({skipped.entry_point}), uninstall it, or set "
                    f"{DISABLE_ENV}=1 to skip discovery") for skipped in found.skipped)
    return verdicts


CHECKS: tuple[Check, ...] = (
    Check("engines", "Engines", check_engines),
    Check("engine_build", "Native llama-server build", check_engine_build),
    Check("capability_conflicts", "Capability conflicts", check_capability_conflicts),
    Check("data_dir", "Data directory", check_data_dir),
    Check("models_dir", "Models directory", check_models_dir),
    Check("storage_headroom", "Model storage headroom", check_storage_headroom),
    Check("dashboard", "Dashboard assets", check_dashboard),
    Check("cluster_key", "Cluster key", check_cluster_key),
    Check("lease", "Data-dir lease", check_lease),
    Check("extensions", "Extensions", check_extensions),
)
"""Every check, in report order. `check_list_markdown` renders it for the docs."""


def check_list_markdown(checks: Sequence[Check] = CHECKS) -> str:
    """The user-facing check list, generated from the registry so docs and checks agree."""
    return "\n".join(f"- **{check.title}** (`{check.id}`): {(check.run.__doc__ or '').strip()}" for check in checks)


def run_checks(inputs: DoctorInputs, checks: Sequence[Check] = CHECKS) -> list[CheckResult]:
    return [CheckResult(check.id, check.title, verdict) for check in checks for verdict in check.run(inputs)]


def has_errors(results: Sequence[CheckResult]) -> bool:
    return any(result.verdict.status == "error" for result in results)


# -- the impure shell -------------------------------------------------------------------------


def default_dashboard_dir(env: Mapping[str, str]) -> Path:
    """The directory the API serves the dashboard from (`skulk.dashboard.dashboard_dir`)."""
    return resolve_dashboard_dir(env)


def _nearest_existing(path: Path) -> Path:
    for candidate in (path, *path.parents):
        if candidate.exists():
            return candidate
    return Path("/")


def path_state(path: Path) -> PathState:
    anchor = _nearest_existing(path)
    try:
        free: int | None = shutil.disk_usage(anchor).free
    except OSError:
        free = None
    writable = os.access(anchor, os.W_OK | os.X_OK) if anchor.is_dir() else False
    return PathState(path=path, exists=path.exists(), writable=writable, free_bytes=free)


def cluster_key_state(path: Path, env: Mapping[str, str]) -> ClusterKeyState:
    from_env = bool(setting(CLUSTER_KEY_ENV, env))
    try:
        mode = path.stat().st_mode
    except OSError:
        return ClusterKeyState(path=path, from_env=from_env, exists=False)
    try:
        empty = not path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        empty = True
    return ClusterKeyState(path=path, from_env=from_env, exists=True, mode=stat.S_IMODE(mode), empty=empty)


def lease_state(path: Path, *, now: float, host: str) -> LeaseState:
    holder = read_lease(path)
    decision = lease_decision(holder, now=now, my_host=host, pid_alive=pid_alive)
    return LeaseState(path=path, holder=holder, held=isinstance(decision, Held))


def gather_doctor_inputs(
    paths: SkulkPaths,
    env: Mapping[str, str],
    *,
    facts: NodeFacts | None = None,
    now: float | None = None,
    host: str | None = None,
    disk_reserve_bytes: int = STORAGE_RESERVE_BYTES,
    extensions: ExtensionSet | None = None,
) -> DoctorInputs:
    """Observe everything the checks judge. `facts` defaults to a fresh probe pass;
    `disk_reserve_bytes` is the node's configured download reserve; `extensions` to a
    discovery pass over the installed entry points (as a node started here would run it)."""
    engine_build: BuildInBackground | NoBuild | None = None
    running = False
    if facts is None:
        from skulk.facts.probe import probe_node_facts
        from skulk.provision.background_install import decide_background_install
        from skulk.provision.llama_build import build_cache_root, engine_search_dirs
        from skulk.provision.llama_install import install_running
        from skulk.provision.node_engine import export_managed_llama_server

        search_dirs = engine_search_dirs(env, Path.home(), paths.data_home)
        env = dict(env)
        export_managed_llama_server(env, search_dirs)  # judge the llama-server a node started here would use
        facts = probe_node_facts(env)
        engine_build = decide_background_install(env, facts, worker_enabled=True, search_dirs=search_dirs)
        running = install_running(build_cache_root(env, Path.home()))
    dashboard_dir = default_dashboard_dir(env)
    return DoctorInputs(
        facts=facts,
        backends=derive_node_backends(facts),
        data_home=path_state(paths.data_home),
        models_dir=path_state(paths.models_dir),
        dashboard_dir=dashboard_dir,
        dashboard_assets_present=(dashboard_dir / INDEX_NAME).is_file(),
        cluster_key=cluster_key_state(paths.cluster_key_file, env),
        lease=lease_state(
            paths.lease_file, now=time.time() if now is None else now, host=host or socket.gethostname()
        ),
        disk_reserve_bytes=disk_reserve_bytes,
        engine_build=engine_build,
        engine_build_running=running,
        extensions=extensions if extensions is not None else _discover_extensions(env),
    )


def _discover_extensions(env: Mapping[str, str]) -> ExtensionSet:
    from skulk.extensions.loader import load_extensions

    return load_extensions(env)


def _install_engine_now() -> bool:
    """`skulk engines install` for this machine's compute, its progress on this terminal."""
    import subprocess
    import sys

    from skulk.provision.background_install import BUILD_DEADLINE_S

    try:
        return subprocess.run([sys.executable, "-m", "skulk", "engines", "install"], timeout=BUILD_DEADLINE_S,
                              check=False).returncode == 0
    except subprocess.TimeoutExpired:
        return False


def apply_fixes(results: Sequence[CheckResult], paths: SkulkPaths) -> list[str]:
    """Apply each distinct safe fix named by a non-OK verdict, once. Idempotent. Returns
    the fix ids applied."""
    from skulk.datadir.paths import ensure_dirs
    from skulk.routing.cluster_key import load_or_create_cluster_key

    wanted = [r.verdict.fix for r in results if r.verdict.status != "ok" and r.verdict.fix is not None]
    applied: list[str] = []
    # Directories first: the key lives in the data dir.
    for fix in (FIX_STORAGE, FIX_CLUSTER_KEY, FIX_KEY_PERMISSIONS, FIX_ENGINE_BUILD):
        if fix not in wanted:
            continue
        if fix == FIX_STORAGE:
            ensure_dirs(paths)
        elif fix == FIX_CLUSTER_KEY:
            load_or_create_cluster_key(paths.data_home)
        elif fix == FIX_KEY_PERMISSIONS:
            os.chmod(paths.cluster_key_file, 0o600)
        elif not _install_engine_now():
            continue
        applied.append(fix)
    return applied


__all__ = [
    "CHECKS",
    "STORAGE_ERROR_BYTES",
    "STORAGE_RESERVE_BYTES",
    "Check",
    "CheckResult",
    "ClusterKeyState",
    "DoctorInputs",
    "LeaseState",
    "PathState",
    "Verdict",
    "apply_fixes",
    "check_list_markdown",
    "gather_doctor_inputs",
    "has_errors",
    "run_checks",
]
