"""Every `SKULK_*` environment setting, declared once: its kind, default, meaning and where
it is explained.

Code reads a setting only through `setting(name, env)`, which refuses a name not declared
here, so a new knob cannot appear without a row (and `docs/SETTINGS.md`, which a test holds
equal to `settings_table()`). Parsing stays with the code that uses a value: this module
only says what exists and hands back its text.

Scopes: `node` settings are an operator's (read by `skulk run` and its runners); `cli` ones
by the command-line client; `internal` ones the node sets for its own runner processes (an
operator never needs them); `test` ones are test-suite knobs that change a node's timing or
drop messages on purpose, never set in production.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, Literal

Scope = Literal["node", "cli", "internal", "test"]
Kind = Literal["text", "integer", "number", "flag", "path", "paths", "list", "secret", "url"]


@dataclass(frozen=True)
class Setting:
    name: str
    """The variable, or a pattern with `<ENGINE>` standing for an engine name in capitals."""
    kind: Kind
    default: str
    """What applies when unset, as the docs say it ("" for none: the meaning says what
    happens). Documentation: the code that parses the value applies it."""
    meaning: str
    doc: str
    """Where the setting is explained at length (a file, with a section)."""
    scope: Scope = "node"


SETTINGS: Final[tuple[Setting, ...]] = (
    # Where the node keeps things.
    Setting("SKULK_HOME", "path", "", "The node's data root (event log, lease, config, cards, models); the same as "
            "`--data-dir`.", "README.md#data-directories"),
    Setting("SKULK_DATA_HOME", "path", "$XDG_DATA_HOME/skulk", "The data root when neither `--data-dir` nor "
            "`SKULK_HOME` is given.", "README.md#data-directories"),
    Setting("SKULK_CACHE_HOME", "path", "$XDG_CACHE_HOME/skulk", "Where traces and other caches go.",
            "README.md#data-directories"),
    Setting("SKULK_MODELS_DIR", "path", "<data root>/models", "Where downloaded models live.",
            "README.md#data-directories"),
    Setting("SKULK_CUSTOM_MODEL_CARDS_DIR", "path", "<data root>/custom_model_cards", "Where custom model cards "
            "live.", "README.md#data-directories"),
    Setting("SKULK_DEVICE_LEASE_DIR", "path", "$TMPDIR/skulk-device-leases", "Where nodes on one machine lease its "
            "accelerators to each other.", "README.md#data-directories"),
    Setting("SKULK_MODELS_LOCAL_DIRS", "paths", "", "Directories `POST /models/add` may register local models "
            "from, besides the models dir (`models.local_dirs`).", "README.md#secure-by-default"),
    Setting("SKULK_DISK_RESERVE_GB", "number", "10", "Free space (GiB) downloads and staging always leave "
            "(`model_store.disk_reserve_gb`).", "README.md#downloads"),
    # The node's network face.
    Setting("SKULK_API_HOST", "text", "0.0.0.0", "The address the API binds (`--api-host`).", "README.md#run"),
    Setting("SKULK_API_PORT", "integer", "52415", "The API's HTTP port (`--api-port`).", "README.md#run"),
    Setting("SKULK_LISTEN", "list", "", "Transport endpoints to listen on (`--listen`).", "README.md#run"),
    Setting("SKULK_BOOTSTRAP_PEERS", "list", "", "Peers to dial at start (`--bootstrap-peers`).", "README.md#run"),
    Setting("SKULK_CLUSTER_KEY", "secret", "", "The cluster's shared secret (`--cluster-key`); without it the "
            "node uses the data dir's `cluster.key`.", "README.md#secure-by-default"),
    Setting("SKULK_CLUSTER_KEY_FILE", "path", "", "A file holding the cluster's shared secret "
            "(`--cluster-key-file`).", "README.md#secure-by-default"),
    Setting("SKULK_JOIN_TOKEN", "secret", "", "A join token from `skulk cluster invite` (`--join`): the node "
            "redeems it once, then keeps the cluster key in its data dir.", "docs/JOINING.md"),
    Setting("SKULK_API_KEY", "secret", "<data root>/api.key", "The key non-loopback clients present "
            "(`api.api_key`); the CLI client sends it too.", "README.md#secure-by-default"),
    Setting("SKULK_OPERATOR_KEY", "secret", "", "The key operator routes require (`api.operator_key`).",
            "README.md#secure-by-default"),
    Setting("SKULK_API_REQUIRE_KEY_ON_LOOPBACK", "flag", "false", "Loopback clients need the key too "
            "(`api.require_key_on_loopback`).", "README.md#secure-by-default"),
    Setting("SKULK_API_OPEN_TO_LAN", "flag", "false", "LAN clients need no key (`api.open_to_lan`).",
            "README.md#secure-by-default"),
    Setting("SKULK_ALLOWED_HOSTS", "list", "", "Host names the API answers besides this machine's own "
            "(`api.allowed_hosts`).", "README.md#secure-by-default"),
    Setting("SKULK_CORS_ORIGINS", "list", "", "Browser origins allowed beside this machine's own "
            "(`api.cors_origins`; `*` is any).", "README.md#secure-by-default"),
    Setting("SKULK_API_MAX_BODY_BYTES", "integer", "8388608", "Request bodies above this get 413 before they are "
            "parsed (`api.max_body_bytes`).", "README.md#secure-by-default"),
    Setting("SKULK_IMAGE_FETCH_ALLOW_PRIVATE", "flag", "false", "`1`: image URLs in chat requests may name "
            "private and loopback addresses (a LAN image server); refused by default.", "docs/VISION.md"),
    Setting("SKULK_DASHBOARD_DIR", "path", "", "Serve a modified copy of the dashboard from this directory.",
            "README.md#dashboard"),
    Setting("SKULK_LOG_LEVEL", "text", "INFO", "The node's log level.", "README.md#observability"),
    Setting("SKULK_RUNNER_LOG_LEVEL", "text", "INFO", "Runner processes' log level.", "README.md#observability"),
    Setting("SKULK_TELEMETRY_DISABLE", "flag", "false", "`1`: no field telemetry from this node, whatever "
            "skulk.yaml's `telemetry.enabled` or the dashboard's switch say (any value but `0`, `false`, `no`, "
            "`off` counts as set).", "docs/TELEMETRY.md"),
    Setting("SKULK_EXTENSIONS_DISABLE", "flag", "false", "`1`: skip extension discovery entirely (a node-local "
            "kill switch; the node runs as if no extension were installed).", "docs/EXTENSIONS.md"),
    # Engines.
    Setting("SKULK_ENGINES_DIR", "path", "$XDG_CACHE_HOME/skulk/engines", "Where `skulk engines install` puts "
            "builds; every node on the machine finds them there.", "docs/ENGINES.md"),
    Setting("SKULK_ENGINE_BUILD_CACHE", "path", "$XDG_CACHE_HOME/skulk/engines", "Where engine source "
            "builds keep their sources and objects.", "docs/ENGINES.md"),
    Setting("SKULK_NO_ENGINE_AUTOPROVISION", "flag", "false", "A node does not build llama-server in the "
            "background at start.", "docs/ENGINES.md"),
    Setting("SKULK_BUNDLED_LLAMA_SERVER", "flag", "1", "`0`: no bundled llama-server (the node then serves GGUF "
            "in-process, one request at a time, until a managed build exists).", "docs/ENGINES.md"),
    Setting("SKULK_LLAMA_SERVER_BIN", "path", "", "Use this llama-server instead of the managed or bundled one "
            "(an invalid path is a loud `invalid_engine_binary`).", "docs/ENGINES.md"),
    Setting("SKULK_LLAMA_SERVER_PARALLEL", "integer", "4", "Slots per llama-server instance (1..64).",
            "docs/ENGINES.md"),
    Setting("SKULK_VLLM_BIN", "path", "", "The `vllm` executable (its own venv).", "docs/ENGINES.md"),
    Setting("SKULK_VLLM_MAX_CONCURRENT_REQUESTS", "integer", "16", "vLLM's `--max-num-seqs` (1..256).",
            "docs/ENGINES.md"),
    Setting("SKULK_<ENGINE>_BACKENDS", "list", "", "Declare the compute backends an engine's build has (e.g. "
            "`SKULK_LLAMA_CPP_BACKENDS=cuda,cpu`), honoured over what the probe finds.", "docs/ENGINES.md"),
    Setting("SKULK_<ENGINE>_BIN", "path", "", "An engine's executable (the named ones above are the engines "
            "that have one).", "docs/ENGINES.md"),
    Setting("SKULK_LLAMA_CPP_FLASH_ATTN", "flag", "1", "`0` turns Flash Attention off node-wide (a card's "
            "`runtime.flash_attn` pins it per model).", "README.md#speed"),
    Setting("SKULK_KV_COLD_BUDGET_MB", "integer", "256", "Per runner: RAM for conversations' KV kept cold "
            "between requests (0 turns it off; a capacity plan's figure wins when unset).", "README.md#speed"),
    Setting("SKULK_MLX_BATCH_WIDTH", "integer", "8", "Concurrent requests one MLX rank decodes together (1: "
            "unbatched).", "README.md#speed"),
    Setting("SKULK_HUGEPAGES", "flag", "1", "`0`: engine processes keep malloc's default pages.",
            "README.md#llamacpp-pooling"),
    Setting("SKULK_GROUP_CONNECT_DEADLINE_SECONDS", "number", "120", "How long an MLX rank waits for its whole "
            "ring to connect before the load fails.", "README.md#sharding"),
    Setting("SKULK_PIPELINE_EVAL_TIMEOUT_SECONDS", "number", "60", "Longest one guarded MLX pipeline step may "
            "take before the group counts as wedged.", "README.md#sharding"),
    Setting("SKULK_POOL_ENCRYPT", "flag", "1", "`0`: a llama.cpp pool's traffic between nodes is authenticated "
            "but not encrypted.", "README.md#llamacpp-pooling"),
    Setting("SKULK_POOL_CONNECT_DEADLINE_SECONDS", "number", "120", "How long a pool driver waits for its donors.",
            "README.md#llamacpp-pooling"),
    Setting("SKULK_POOL_TENSOR_CACHE_DIR", "path", "", "Turns on the donors' tensor cache, in this directory.",
            "README.md#llamacpp-pooling"),
    Setting("SKULK_POOL_RPC_SERVER_BIN", "path", "", "The donor's native ggml RPC server (exported from the "
            "managed build when unset).", "docs/ENGINES.md"),
    # Set by the node for its runners.
    Setting("SKULK_LLAMA_SERVER_MANAGED_BACKEND", "text", "", "The backend of the llama-server the node chose.",
            "docs/ENGINES.md", "internal"),
    Setting("SKULK_LLAMA_SERVER_SOURCE", "text", "", "Where that llama-server came from (override, managed, "
            "bundled).", "docs/ENGINES.md", "internal"),
    Setting("SKULK_BUNDLED_LLAMA_SITE", "path", "", "The site-packages of a bundled GPU wheel.", "docs/ENGINES.md",
            "internal"),
    Setting("SKULK_POOL_RPC_SERVER_SOURCE", "text", "", "`managed` when the node exported the RPC server path.",
            "docs/ENGINES.md", "internal"),
    # The CLI client.
    Setting("SKULK_URL", "url", "http://localhost:52415", "The node the CLI client talks to (`--url`).",
            "README.md#cli-client", "cli"),
    # Test-suite knobs.
    Setting("SKULK_TEST_NODE_TIMEOUT_SECONDS", "number", "", "The master prunes a silent node after this long.",
            "tests/", "test"),
    Setting("SKULK_BUILD_COMMIT", "text", "the git checkout's HEAD, else the VCS install's commit",
            "The source commit this node reports (`nodeResources[].commit`): a packager's stamp, or a test "
            "playing two builds.", "docs/SERVICE.md#upgrades"),
    Setting("SKULK_TEST_MASTER_DROPS_GENERATIONS", "integer", "", "The master ignores this many first "
            "GenerateText commands.", "tests/", "test"),
    Setting("SKULK_TEST_WORKER_RAM_AVAILABLE_BYTES", "integer", "", "The pre-spawn memory guard reads this as "
            "free memory.", "tests/", "test"),
    Setting("SKULK_TEST_API_DROPS_INPUT_CHUNKS", "list", "", "The API node never sends these chunks (by number) "
            "of a task input to another node.", "tests/", "test"),
    Setting("SKULK_TEST_WORKER_DROPS_TERMINALS", "flag", "", "The worker drops terminal frames bound for a remote "
            "API.", "tests/", "test"),
)

ENGINE_PATTERN = "<ENGINE>"


def _pattern(name: str) -> re.Pattern[str]:
    return re.compile("^" + re.escape(name).replace(re.escape(ENGINE_PATTERN), "[A-Z0-9_]+") + "$")


_EXACT: Final = {s.name: s for s in SETTINGS if ENGINE_PATTERN not in s.name}
_PATTERNS: Final = tuple((_pattern(s.name), s) for s in SETTINGS if ENGINE_PATTERN in s.name)


class UnknownSetting(KeyError):
    """A `SKULK_*` name nobody declared in `SETTINGS`."""


def declared(name: str) -> Setting:
    """The row for `name` (an engine pattern's row for `SKULK_LLAMA_CPP_BACKENDS`), or
    `UnknownSetting`."""
    if name in _EXACT:
        return _EXACT[name]
    for pattern, row in _PATTERNS:
        if pattern.match(name):
            return row
    raise UnknownSetting(f"{name} is not declared in skulk.shared.settings.SETTINGS")


def setting(name: str, env: Mapping[str, str] | None = None) -> str:
    """The setting's text in `env` (default: this process's environment), stripped; "" when
    unset. The caller parses it and applies the default its row documents (some defaults
    depend on other things, such as a capacity plan, so they stay with the code)."""
    declared(name)
    return (os.environ if env is None else env).get(name, "").strip()


def settings_table() -> str:
    """The Markdown table of every setting, as `docs/SETTINGS.md` holds it."""
    lines = ["| Variable | Scope | Kind | Default | Meaning | Explained in |", "|---|---|---|---|---|---|"]
    for row in SETTINGS:
        default = f"`{row.default}`" if row.default else ""
        lines.append(f"| `{row.name}` | {row.scope} | {row.kind} | {default} | {row.meaning} | {row.doc} |")
    return "\n".join(lines) + "\n"


__all__ = ["SETTINGS", "Setting", "UnknownSetting", "declared", "setting", "settings_table"]
