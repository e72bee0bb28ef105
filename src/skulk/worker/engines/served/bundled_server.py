"""The bundled llama-server: llama.cpp's own HTTP server from the `xllamacpp` wheel.

A fresh node has no llama-server binary until `skulk engines install` compiles one (5 to
30 minutes), and the in-process engine decodes one request at a time. `xllamacpp` ships
llama.cpp's server (slots, continuous batching, prompt cache) compiled into a prebuilt
wheel for CPU and Metal on PyPI, and for CUDA, ROCm and Vulkan from its own indexes. This
module runs that server as a process of its own, started exactly as the served
`llama_server` engine starts a native llama-server: the same command line (the subset
`skulk.worker.engines.served.launch.ServerLaunch.argv` writes), the same loopback HTTP
API, the same teardown (its own process group, PR_SET_PDEATHSIG from the runner). So every
rule of the served engine (slot admission, token-id prompts, grammars, logprobs, typed
errors) applies unchanged, and a managed native build, when one exists, replaces it with
no other difference (`skulk.provision.node_engine` chooses).

The console script `skulk-llama-server` is this module's `main`. A flag this host does not
know is refused (exit 2, naming it), never ignored: a new flag in `ServerLaunch` must be
mapped here too.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from skulk.provision.bundled_report import backend_of_devices, version_report
from skulk.provision.node_engine import SITE_ENV
from skulk.shared.settings import setting

SCRIPT_NAME = "skulk-llama-server"
EXIT_USAGE = 2
EXIT_LOAD_FAILED = 1
STOP_SIGNALS = frozenset({signal.SIGTERM, signal.SIGINT})

class UnsupportedFlag(ValueError):
    """A command-line flag (or value) the bundled server does not honour."""


@dataclass(frozen=True)
class HostSettings:
    """What the command line asked for, typed. Defaults are llama-server's own where the
    command line is silent."""

    model: str
    host: str = "127.0.0.1"
    port: int = 8080
    parallel: int = 1
    ctx_size: int = 0
    kv_unified: bool | None = None
    cont_batching: bool = True
    threads: int | None = None
    gpu_layers: int | None = None
    flash_attn: str = "auto"
    fit: bool = True
    jinja: bool = True
    webui: bool = True
    cache_ram_mib: int | None = None
    cache_type_k: str | None = None
    cache_type_v: str | None = None
    spec_type: str | None = None
    model_draft: str | None = None
    threads_draft: int | None = None
    gpu_layers_draft: int | None = None
    cache_type_k_draft: str | None = None
    cache_type_v_draft: str | None = None
    mmproj: str | None = None
    """The multimodal projector (`--mmproj`) of a vision card."""
    extras: Mapping[str, Any] = field(default_factory=dict)


_INT_FLAGS: Mapping[str, str] = {
    "--port": "port", "--parallel": "parallel", "-np": "parallel", "--ctx-size": "ctx_size", "-c": "ctx_size",
    "--threads": "threads", "-t": "threads", "--n-gpu-layers": "gpu_layers", "-ngl": "gpu_layers",
    "--cache-ram": "cache_ram_mib", "--threads-draft": "threads_draft", "-td": "threads_draft",
    "--n-gpu-layers-draft": "gpu_layers_draft", "-ngld": "gpu_layers_draft",
}
_STR_FLAGS: Mapping[str, str] = {"--model": "model", "-m": "model", "--host": "host", "--model-draft": "model_draft",
                                 "-md": "model_draft", "--mmproj": "mmproj", "-mm": "mmproj"}
_SWITCHES: Mapping[str, tuple[str, bool]] = {
    "--no-kv-unified": ("kv_unified", False), "--kv-unified": ("kv_unified", True),
    "--cont-batching": ("cont_batching", True), "--no-cont-batching": ("cont_batching", False),
    "--jinja": ("jinja", True), "--no-jinja": ("jinja", False), "--no-webui": ("webui", False),
}
_ON_OFF: Mapping[str, bool] = {"on": True, "off": False}
_CACHE_TYPE_FLAGS: Mapping[str, str] = {"--cache-type-k": "cache_type_k", "-ctk": "cache_type_k",
                                        "--cache-type-v": "cache_type_v", "-ctv": "cache_type_v",
                                        "--cache-type-k-draft": "cache_type_k_draft", "-ctkd": "cache_type_k_draft",
                                        "--cache-type-v-draft": "cache_type_v_draft", "-ctvd": "cache_type_v_draft"}
CACHE_TYPES: tuple[str, ...] = ("f16", "q8_0", "q4_0")
"""The KV cache types this host takes (`skulk.shared.types.kv_cache`)."""
SPEC_TYPES: Mapping[str, str] = {"none": "COMMON_SPECULATIVE_TYPE_NONE", "ngram-simple": "COMMON_SPECULATIVE_TYPE_NGRAM_SIMPLE",
                                 "draft-simple": "COMMON_SPECULATIVE_TYPE_DRAFT_SIMPLE"}
"""The `--spec-type` values this host takes, and xllamacpp's name for each."""


def parse_server_argv(argv: Sequence[str]) -> HostSettings:
    """The settings a llama-server command line (without the program name) asks for.
    Raises `UnsupportedFlag` for a flag or value this host cannot honour."""
    values: dict[str, Any] = {}
    args = list(argv)
    index = 0

    def value_of(flag: str) -> str:
        if index + 1 >= len(args):
            raise UnsupportedFlag(f"{flag} needs a value")
        return args[index + 1]

    while index < len(args):
        flag = args[index]
        if flag in _SWITCHES:
            name, on = _SWITCHES[flag]
            values[name] = on
            index += 1
            continue
        if flag in _INT_FLAGS:
            raw = value_of(flag)
            try:
                values[_INT_FLAGS[flag]] = int(raw)
            except ValueError:
                raise UnsupportedFlag(f"{flag} takes a whole number, not {raw!r}") from None
        elif flag in _STR_FLAGS:
            values[_STR_FLAGS[flag]] = value_of(flag)
        elif flag in ("--flash-attn", "-fa"):
            raw = value_of(flag)
            if raw not in ("on", "off", "auto"):
                raise UnsupportedFlag(f"{flag} takes on, off or auto, not {raw!r}")
            values["flash_attn"] = raw
        elif flag in _CACHE_TYPE_FLAGS:
            raw = value_of(flag)
            if raw not in CACHE_TYPES:
                raise UnsupportedFlag(f"{flag} takes {', '.join(CACHE_TYPES)} here, not {raw!r}")
            values[_CACHE_TYPE_FLAGS[flag]] = raw
        elif flag == "--spec-type":
            raw = value_of(flag)
            if raw not in SPEC_TYPES:
                raise UnsupportedFlag(f"--spec-type takes {', '.join(SPEC_TYPES)} here, not {raw!r}")
            values["spec_type"] = raw
        elif flag == "--fit":
            raw = value_of(flag)
            if raw not in _ON_OFF:
                raise UnsupportedFlag(f"--fit takes on or off, not {raw!r}")
            values["fit"] = _ON_OFF[raw]
        else:
            raise UnsupportedFlag(f"{flag} is not a flag the bundled llama-server ({SCRIPT_NAME}) honours")
        index += 2
    if "model" not in values:
        raise UnsupportedFlag("--model is required")
    if (values.get("spec_type") == "draft-simple") != ("model_draft" in values):
        raise UnsupportedFlag("--spec-type draft-simple and --model-draft go together")
    return HostSettings(**values)


def apply_settings(settings: HostSettings, params: Any, flash_types: Any, ggml_types: Any = None,
                   spec_types: Any = None) -> None:
    """Copy `settings` onto an `xllamacpp.CommonParams` (`flash_types`: its
    `llama_flash_attn_type` enum; `ggml_types`: its `ggml_type` enum, for the cache types;
    `spec_types`: its `common_speculative_type` enum)."""
    params.model.path = settings.model
    params.hostnames = [settings.host]
    params.port = settings.port
    params.n_parallel = settings.parallel
    params.n_ctx = settings.ctx_size
    if settings.kv_unified is not None:
        params.kv_unified = settings.kv_unified
    params.cont_batching = settings.cont_batching
    if settings.threads is not None:
        params.cpuparams.n_threads = settings.threads
        params.cpuparams_batch.n_threads = settings.threads
    if settings.gpu_layers is not None:
        params.n_gpu_layers = settings.gpu_layers
    params.flash_attn_type = {
        "on": flash_types.LLAMA_FLASH_ATTN_TYPE_ENABLED,
        "off": flash_types.LLAMA_FLASH_ATTN_TYPE_DISABLED,
        "auto": flash_types.LLAMA_FLASH_ATTN_TYPE_AUTO,
    }[settings.flash_attn]
    params.fit_params = settings.fit
    params.use_jinja = settings.jinja
    params.ui = settings.webui
    if settings.cache_ram_mib is not None:
        params.cache_ram_mib = settings.cache_ram_mib
    if settings.spec_type is not None:
        params.speculative.types = [getattr(spec_types, SPEC_TYPES[settings.spec_type])]
    for name in ("cache_type_k", "cache_type_v"):
        value = getattr(settings, name)
        if value is not None:
            setattr(params, name, getattr(ggml_types, f"GGML_TYPE_{value.upper()}"))
    if settings.mmproj is not None:
        params.mmproj.path = settings.mmproj
    draft = params.speculative.draft
    if settings.model_draft is not None:
        draft.mparams.path = settings.model_draft
    if settings.threads_draft is not None:
        draft.cpuparams.n_threads = settings.threads_draft
        draft.cpuparams_batch.n_threads = settings.threads_draft
    if settings.gpu_layers_draft is not None:
        draft.n_gpu_layers = settings.gpu_layers_draft
    for name in ("cache_type_k", "cache_type_v"):
        value = getattr(settings, f"{name}_draft")
        if value is not None:
            setattr(draft, name, getattr(ggml_types, f"GGML_TYPE_{value.upper()}"))


def _package_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("xllamacpp")
    except PackageNotFoundError:
        return "unknown"


def main(argv: Sequence[str] | None = None, *, on_ready: Callable[[str], None] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    site = setting(SITE_ENV)
    if site:  # a GPU wheel installed beside the engines (`skulk engines install --wheel`)
        sys.path.insert(0, site)
    try:
        import xllamacpp
    except ImportError as exc:
        print(f"{SCRIPT_NAME}: the xllamacpp package does not import: {exc}", file=sys.stderr)
        return EXIT_LOAD_FAILED
    if "--version" in args:
        print(version_report(_package_version(), backend_of_devices(xllamacpp.get_device_info())), flush=True)
        return 0
    try:
        settings = parse_server_argv(args)
    except UnsupportedFlag as exc:
        print(f"{SCRIPT_NAME}: {exc}", file=sys.stderr, flush=True)
        return EXIT_USAGE
    # Blocked before the server starts its threads (they inherit the mask), so the owner's
    # SIGTERM reaches the `sigwait` below and nothing else: no polling while idle.
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    params = xllamacpp.CommonParams()
    ggml_types = xllamacpp.ggml_type  # pyright: ignore[reportAttributeAccessIssue] -- in the wheel, not its stubs
    spec_types = xllamacpp.common_speculative_type  # pyright: ignore[reportAttributeAccessIssue] -- likewise
    apply_settings(settings, params, xllamacpp.llama_flash_attn_type, ggml_types, spec_types)
    try:
        server = xllamacpp.Server(params)
    except Exception as exc:  # the wheel raises plain RuntimeErrors for a model it cannot load
        print(f"{SCRIPT_NAME}: cannot serve {settings.model}: {exc}", file=sys.stderr, flush=True)
        return EXIT_LOAD_FAILED
    address = str(server.listening_address)
    print(f"{SCRIPT_NAME}: serving {settings.model} on {address}", flush=True)
    if on_ready is not None:
        on_ready(address)
    signal.sigwait(STOP_SIGNALS)
    sys.stdout.flush()
    # The server's threads are llama.cpp's own; a normal interpreter exit would run its
    # destructor while requests may still be in flight. The owner asked us to stop: go.
    os._exit(0)


__all__ = [
    "SCRIPT_NAME",
    "HostSettings",
    "UnsupportedFlag",
    "apply_settings",
    "main",
    "parse_server_argv",
]
