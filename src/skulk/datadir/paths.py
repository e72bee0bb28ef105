"""Where a node keeps its files.

Resolution is a pure function of the environment, the platform and the `--data-dir` flag,
so every precedence rule is tested as a table. Precedence for the data root:
`--data-dir` > `SKULK_HOME` > `SKULK_DATA_HOME` > platform default (XDG on Linux,
`~/.skulk` on macOS and Windows). Models, cache and custom cards default under it and each
has its own override. Nothing here creates directories: `ensure_dirs` does, in the shell.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from skulk.shared.settings import setting

CONFIG_FILE_NAME = "skulk.yaml"
LEASE_FILE_NAME = "skulk.lease"
EVENT_LOG_DIR_NAME = "event_log"
CLUSTER_KEY_FILE_NAME = "cluster.key"
API_KEY_FILE_NAME = "api.key"
TELEMETRY_INSTALL_ID_FILE_NAME = "telemetry_install_id"
"""The random id opted-in field telemetry sends with each batch (docs/TELEMETRY.md): created
only when the operator opts in, mode 0600."""

PRIVATE_DIR_MODE = 0o700
PRIVATE_FILE_MODE = 0o600
"""The data dir holds the event log, keys and lease: nobody but the node's user reads it."""


@dataclass(frozen=True)
class SkulkPaths:
    data_home: Path
    models_dir: Path
    cache_home: Path
    custom_cards_dir: Path

    @property
    def config_file(self) -> Path:
        return self.data_home / CONFIG_FILE_NAME

    @property
    def lease_file(self) -> Path:
        return self.data_home / LEASE_FILE_NAME

    @property
    def event_log_dir(self) -> Path:
        return self.data_home / EVENT_LOG_DIR_NAME

    @property
    def cluster_key_file(self) -> Path:
        return self.data_home / CLUSTER_KEY_FILE_NAME

    @property
    def api_key_file(self) -> Path:
        return self.data_home / API_KEY_FILE_NAME

    @property
    def telemetry_install_id_file(self) -> Path:
        return self.data_home / TELEMETRY_INSTALL_ID_FILE_NAME

    @property
    def traces_dir(self) -> Path:
        return self.cache_home / "traces"


def _is_xdg_platform(platform: str) -> bool:
    return not (platform.startswith("darwin") or platform.startswith("win"))


def default_data_home(env: Mapping[str, str], platform: str, home: Path) -> Path:
    if _is_xdg_platform(platform):
        xdg = env.get("XDG_DATA_HOME")
        return (Path(xdg) if xdg else home / ".local" / "share") / "skulk"
    return home / ".skulk"


def default_cache_home(env: Mapping[str, str], platform: str, home: Path, data_home: Path) -> Path:
    if _is_xdg_platform(platform):
        xdg = env.get("XDG_CACHE_HOME")
        return (Path(xdg) if xdg else home / ".cache") / "skulk"
    return data_home / "cache"


def resolve_paths(
    env: Mapping[str, str],
    platform: str,
    home: Path,
    data_dir_flag: Path | None = None,
) -> SkulkPaths:
    """Resolve every storage path. An explicit data root (flag or SKULK_HOME) also holds the
    cache, so that two nodes on one machine with distinct data dirs never share traces."""
    explicit_root = data_dir_flag or (Path(setting("SKULK_HOME", env)) if setting("SKULK_HOME", env) else None)
    if explicit_root is not None:
        data_home = explicit_root
    elif setting("SKULK_DATA_HOME", env):
        data_home = Path(setting("SKULK_DATA_HOME", env))
    else:
        data_home = default_data_home(env, platform, home)

    if setting("SKULK_CACHE_HOME", env):
        cache_home = Path(setting("SKULK_CACHE_HOME", env))
    elif explicit_root is not None:
        cache_home = data_home / "cache"
    else:
        cache_home = default_cache_home(env, platform, home, data_home)

    models_dir = Path(setting("SKULK_MODELS_DIR", env)) if setting("SKULK_MODELS_DIR", env) else data_home / "models"
    cards_env = setting("SKULK_CUSTOM_MODEL_CARDS_DIR", env)
    custom_cards_dir = Path(cards_env) if cards_env else data_home / "custom_model_cards"
    return SkulkPaths(
        data_home=data_home.expanduser(),
        models_dir=models_dir.expanduser(),
        cache_home=cache_home.expanduser(),
        custom_cards_dir=custom_cards_dir.expanduser(),
    )


def hub_model_dir_name(model_id: str, revision: str | None) -> str:
    """Directory (under the models dir) of a Hugging Face card's artifact: 'owner--name' for
    the repo's main branch, 'owner--name@<commit>' for a pinned revision. The pin is part of
    artifact identity, so pinned bytes never share the mutable-main path and a moved main can
    never substitute different weights for a pinned card. Hub ids never contain '--', so the
    name maps back to one id."""
    base = model_id.replace("/", "--")
    return base if revision is None else f"{base}@{revision}"


def ensure_dirs(paths: SkulkPaths) -> None:
    """Create the node's directories (the shell's job, never the resolver's), private to
    the node's user: the data dir 0700, the event log's files 0600 (a log written by an
    older build with looser modes is tightened here)."""
    for directory in (paths.data_home, paths.event_log_dir, paths.models_dir, paths.cache_home, paths.custom_cards_dir):
        directory.mkdir(parents=True, exist_ok=True, mode=PRIVATE_DIR_MODE)
    for directory in (paths.data_home, paths.event_log_dir):
        directory.chmod(PRIVATE_DIR_MODE)
    for file in paths.event_log_dir.rglob("*"):
        if file.is_file() and file.stat().st_mode & 0o077:
            file.chmod(PRIVATE_FILE_MODE)
