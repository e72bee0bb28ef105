"""From probed NodeFacts to the backend tags a node advertises, and every disagreement.

`derive_node_backends(facts)` is pure: the whole capability pipeline is tested with
synthetic facts, no hardware. For each engine the node can run (ENGINES, in tag order), the
compute list comes from the first rule that yields one:

  1. operator declaration   SKULK_<ENGINE>_BACKENDS="cuda,cpu" (honoured even when the
                            hardware is not observed; that disagreement is a warning)
  2. the engine build       llama_cpp's own GPU-offload report: a CPU-only build serves on
                            CPU whatever GPU is present
  3. hardware vendor        a visible GPU of a vendor the engine has a compute for
  4. CPU floor              only when nothing above yields a GPU compute (and only for
                            engines that can run on CPU at all)

An engine is advertised only when it can load: its packages import (in-process engines) or
its configured binary is usable (served engines). Each advertised engine contributes its
bare name plus one '<engine>-<compute>' tag per compute, e.g. a Linux CPU box with llama_cpp
and mlx importable advertises ["llama_cpp", "llama_cpp-cpu", "mlx", "mlx-cpu"].

Disagreements never resolve silently: each becomes a CapabilityConflict with one of the
stable codes below, a message carrying the observed and declared values, and a remediation.
This module must never do I/O or read the environment; declarations arrive in the facts.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import cast

from skulk.shared.slots import SlotSettingError, node_slot_settings
from skulk.shared.types.cards import KNOWN_COMPUTES
from skulk.shared.types.engines import ENGINE_TRAITS, EngineTraits
from skulk.shared.types.node_facts import ENGINE_BINARY_ENV, GpuVendor, NodeFacts
from skulk.shared.types.telemetry import CapabilityConflict

GPU_SERVING_DISABLED = "gpu_serving_disabled"
"""error: a GPU is visible but every advertised backend serves on CPU."""
GPU_DETECTION_DEGRADED = "gpu_detection_degraded"
"""warn: an NVIDIA device node exists but NVML cannot read it (VRAM unknown)."""
INVALID_ENGINE_BINARY = "invalid_engine_binary"
"""warn: an engine binary override points at a missing or non-executable path."""
BACKEND_OVERRIDE_CONFLICT = "backend_override_conflict"
"""warn: a declaration claims hardware (or an engine) the node cannot observe, or names
a compute this build does not know. Honoured where it can be."""

INVALID_SLOT_SETTING = "invalid_slot_setting"
"""error: a served engine's slot setting is not a whole number within bounds; that engine is
not advertised until it is fixed."""

CPU = "cpu"


def backends_env_var(engine: str) -> str:
    """'llama_cpp' -> 'SKULK_LLAMA_CPP_BACKENDS'."""
    return f"SKULK_{engine.upper()}_BACKENDS"


@dataclass(frozen=True)
class EngineSpec:
    """How one engine's availability and computes follow from the facts."""

    engine: str
    available: Callable[[NodeFacts], bool]
    requirement: str
    """What 'available' means, for messages ('llama_cpp imports')."""
    vendor_computes: Mapping[GpuVendor, str]
    """Compute inferred from a visible GPU of each vendor. Intel is never inferred: an
    integrated Intel GPU is on most machines and is no serving accelerator; declare
    'vulkan' for a discrete one."""
    cpu_floor: bool = True
    build_report: Callable[[NodeFacts], bool | None] = lambda facts: None
    """The engine build's own word on GPU offload (None = no report)."""


def _modules(*names: str) -> Callable[[NodeFacts], bool]:
    return lambda facts: all(facts.importable.get(n, False) for n in names)


def _binary(engine: str) -> Callable[[NodeFacts], bool]:
    def usable(facts: NodeFacts) -> bool:
        binary = facts.engine_binaries.get(engine)
        return binary is not None and binary.state == "usable"

    return usable


def _managed_build_offloads(facts: NodeFacts, engine: str) -> bool | None:
    """A managed build's word on GPU offload: a 'cpu' build serves on CPU whatever GPU is
    present; None when the build's backend is unknown (an operator's own binary)."""
    binary = facts.engine_binaries.get(engine)
    if binary is None or binary.backend is None:
        return None
    return binary.backend != CPU


_BUILD_REPORTS: Mapping[str, Callable[[NodeFacts], bool | None]] = {
    "llama_cpp": lambda facts: facts.llama_cpp_gpu_offload,
    "llama_server": lambda facts: _managed_build_offloads(facts, "llama_server"),
}
"""Engines whose build reports its own GPU offload (how each is read from the facts)."""

def _spec(engine: str, traits: EngineTraits) -> EngineSpec:
    """An engine's availability rule from its traits: its packages import (in-process) or
    its binary answers (served), on Apple Silicon where the engine needs it."""
    if traits.binary_env is not None:
        loads = _binary(engine)
        managed = " (or a managed build: `skulk engines install`)" if traits.managed_build else ""
        requirement = f"{traits.binary_env}{managed} points at a usable binary that answers --version"
    else:
        loads = _modules(*traits.modules)
        noun = "package imports" if len(traits.modules) == 1 else "packages import"
        requirement = f"the {' and '.join(traits.modules)} {noun}"
    if traits.apple_only:
        available = lambda facts, loads=loads: loads(facts) and facts.is_apple_silicon()  # noqa: E731
        requirement += " on Apple Silicon"
    else:
        available = loads
    return EngineSpec(engine, available, requirement, cast(Mapping[GpuVendor, str], traits.vendor_computes),
                      cpu_floor=traits.cpu_floor, build_report=_BUILD_REPORTS.get(engine, lambda facts: None))


ENGINES: tuple[EngineSpec, ...] = tuple(_spec(name, traits) for name, traits in ENGINE_TRAITS.items())
"""Every engine, in tag order, from the engine traits table (`skulk.shared.types.engines`)."""


@dataclass(frozen=True)
class DerivedBackends:
    tags: list[str] = field(default_factory=list)
    conflicts: list[CapabilityConflict] = field(default_factory=list)
    slots: dict[str, int] = field(default_factory=dict)
    """Served engine -> the node's valid slot setting (advertised in NodeResources)."""


@dataclass(frozen=True)
class _Computes:
    computes: tuple[str, ...]
    source: str
    """Why, for messages: 'declared SKULK_LLAMA_CPP_BACKENDS=...', 'build reports no GPU offload', ..."""


def derive_node_backends(facts: NodeFacts) -> DerivedBackends:
    """Advertised backend tags (engines in ENGINES order, bare name first) and conflicts."""
    tags: list[str] = []
    conflicts: list[CapabilityConflict] = []
    sources: dict[str, _Computes] = {}
    slots, slot_errors = node_slot_settings(facts.declarations)
    bad_slots = {error.engine: error for error in slot_errors}
    for spec in ENGINES:
        declared, declaration_conflicts = _declared(spec, facts)
        conflicts.extend(declaration_conflicts)
        if not spec.available(facts):
            if declared is not None:
                conflicts.append(_declared_engine_unavailable(spec, facts))
            continue
        if spec.engine in bad_slots:
            conflicts.append(_invalid_slot_setting(bad_slots[spec.engine]))
            continue
        chosen = declared or _build_reported(spec, facts) or _vendor_inferred(spec, facts) or _cpu_floor(spec)
        if chosen is None:
            continue
        sources[spec.engine] = chosen
        tags.append(spec.engine)
        tags.extend(f"{spec.engine}-{compute}" for compute in chosen.computes)
    conflicts.extend(_invalid_binaries(facts))
    conflicts.extend(_degraded_detection(facts))
    conflicts.extend(_gpu_serving_disabled(facts, sources))
    return DerivedBackends(tags=tags, conflicts=conflicts, slots=slots)


# -- the per-engine rules, in precedence order ---------------------------------------------


def parse_backend_declaration(engine: str, raw: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """'cuda, llama_cpp-cpu' -> (('cuda', 'cpu'), ()): computes in declared order, and the
    entries that name no known compute (or another engine). The bare engine is implied."""
    computes: list[str] = []
    invalid: list[str] = []
    for entry in (part.strip().lower() for part in raw.split(",")):
        if not entry or entry == engine:
            continue
        prefix, sep, rest = entry.partition("-")
        compute = rest if sep and prefix == engine else (entry if not sep else None)
        if compute is None or compute not in KNOWN_COMPUTES:
            invalid.append(entry)
        elif compute not in computes:
            computes.append(compute)
    return tuple(computes), tuple(invalid)


def _declared(spec: EngineSpec, facts: NodeFacts) -> tuple[_Computes | None, list[CapabilityConflict]]:
    var = backends_env_var(spec.engine)
    raw = facts.declarations.get(var)
    if raw is None or not raw.strip():
        return None, []
    computes, invalid = parse_backend_declaration(spec.engine, raw)
    conflicts: list[CapabilityConflict] = []
    if invalid:
        conflicts.append(
            CapabilityConflict(
                code=BACKEND_OVERRIDE_CONFLICT,
                level="warn",
                message=f"{var}={raw!r} names {list(invalid)}, which are not computes of {spec.engine} "
                f"(known: {sorted(KNOWN_COMPUTES)}); those entries are ignored",
                remediation=f"spell {var} as a comma-separated list of computes, e.g. 'cuda,cpu'",
            )
        )
    unobserved = [c for c in computes if not _hardware_observed(c, facts)]
    if unobserved and spec.available(facts):
        conflicts.append(
            CapabilityConflict(
                code=BACKEND_OVERRIDE_CONFLICT,
                level="warn",
                message=f"{var}={raw!r} declares {unobserved} but the node observes "
                f"{_describe_gpus(facts)}; the declaration is honoured",
                remediation=f"check the GPU driver is loaded and visible to Skulk, or remove {unobserved} from {var}",
            )
        )
    if not computes:
        return None, conflicts
    return _Computes(computes, f"declared {var}={raw!r}"), conflicts


def _build_reported(spec: EngineSpec, facts: NodeFacts) -> _Computes | None:
    # Only "no offload" is decisive: a True report names no accelerator (and RPC-enabled
    # builds report True on any box), so the vendor rule picks the compute.
    if spec.build_report(facts) is False:
        return _Computes((CPU,), f"the {spec.engine} build reports no GPU offload (CPU-only build)")
    return None


def _vendor_inferred(spec: EngineSpec, facts: NodeFacts) -> _Computes | None:
    computes = tuple(
        dict.fromkeys(
            spec.vendor_computes[g.vendor]
            for g in facts.gpus
            if g.vendor in spec.vendor_computes and _gpu_has_driver(g.vendor, g.detected_by)
        )
    )
    return _Computes(computes, f"inferred from {_describe_gpus(facts)}") if computes else None


def _cpu_floor(spec: EngineSpec) -> _Computes | None:
    return _Computes((CPU,), "CPU floor (no GPU backend found)") if spec.cpu_floor else None


# -- node-level conflicts -------------------------------------------------------------------


def _declared_engine_unavailable(spec: EngineSpec, facts: NodeFacts) -> CapabilityConflict:
    var = backends_env_var(spec.engine)
    return CapabilityConflict(
        code=BACKEND_OVERRIDE_CONFLICT,
        level="warn",
        message=f"{var}={facts.declarations[var]!r} is set but {spec.engine} cannot load on this node "
        f"(needs: {spec.requirement}); {spec.engine} is not advertised",
        remediation=f"install {spec.engine} on this node, or unset {var}",
    )


def _invalid_slot_setting(error: SlotSettingError) -> CapabilityConflict:
    # Refused, never clamped: a typo'd slot count would otherwise size the KV cache wrongly.
    return CapabilityConflict(
        code=INVALID_SLOT_SETTING,
        level="error",
        message=f"{error.describe()}; {error.engine} is not advertised",
        remediation=f"set {error.variable} to a whole number within bounds, or unset it for the default",
    )


def _invalid_binaries(facts: NodeFacts) -> list[CapabilityConflict]:
    conflicts = []
    for engine, binary in sorted(facts.engine_binaries.items()):
        if binary.state == "usable":
            continue
        var = ENGINE_BINARY_ENV.get(engine, f"SKULK_{engine.upper()}_BIN")
        what = {
            "missing": "does not exist",
            "broken": "does not answer --version (wrong architecture, missing library or a damaged copy)",
        }.get(binary.state, "is not an executable file")
        conflicts.append(
            CapabilityConflict(
                code=INVALID_ENGINE_BINARY,
                level="warn",
                message=f"{var}={binary.path!r} {what} (state {binary.state}); {engine} is not advertised",
                remediation=f"point {var} at an executable {engine} binary (chmod +x if needed), or unset it",
            )
        )
    return conflicts


def _degraded_detection(facts: NodeFacts) -> list[CapabilityConflict]:
    nodes = [g.name for g in facts.gpus if g.vendor == "nvidia" and g.detected_by == "device_node"]
    if not nodes:
        return []
    return [
        CapabilityConflict(
            code=GPU_DETECTION_DEGRADED,
            level="warn",
            message=f"NVIDIA device nodes present ({', '.join(nodes)}) but NVML could not read them: "
            "GPU names and VRAM are unknown, so VRAM-derived behaviour (served-context sizing) falls "
            "back to conservative defaults",
            remediation="install nvidia-ml-py in Skulk's environment and check that `nvidia-smi` works "
            "(driver and kernel module versions must match)",
        )
    ]


def _gpu_serving_disabled(facts: NodeFacts, sources: Mapping[str, _Computes]) -> list[CapabilityConflict]:
    serving_gpus = [g for g in facts.gpus if g.vendor in ("nvidia", "amd", "apple")]
    if not serving_gpus or not sources:
        return []
    if any(c != CPU for chosen in sources.values() for c in chosen.computes):
        return []
    reasons = "; ".join(f"{engine}: {chosen.source}" for engine, chosen in sources.items())
    return [
        CapabilityConflict(
            code=GPU_SERVING_DISABLED,
            level="error",
            message=f"visible GPU {_describe_gpus(facts)} but every backend serves on CPU "
            f"({', '.join(f'{e}-cpu' for e in sources)}): {reasons}",
            remediation=_gpu_remediation(serving_gpus[0].vendor, serving_gpus[0].detected_by),
        )
    ]


def _gpu_remediation(vendor: GpuVendor, detected_by: str) -> str:
    if vendor == "nvidia" and not _gpu_has_driver(vendor, detected_by):
        return "install the NVIDIA proprietary driver (no /dev/nvidia* device node is present)"
    lane = {"nvidia": "CUDA", "amd": "Vulkan (or ROCm)", "apple": "Metal"}[vendor]
    compute = ENGINE_TRAITS["llama_server"].vendor_computes[vendor]
    return (
        f"run `skulk engines install --backend {compute}` (a {lane} llama-server), install a "
        f"{lane} build of llama-cpp-python or point SKULK_LLAMA_SERVER_BIN at a {lane} llama-server; if the installed build already supports it, declare it with "
        f"SKULK_LLAMA_CPP_BACKENDS (e.g. '{compute}')"
    )


# -- observations ----------------------------------------------------------------------------


def _gpu_has_driver(vendor: GpuVendor, detected_by: str) -> bool:
    # An NVIDIA card seen only in sysfs has no proprietary driver loaded (no /dev/nvidiaN):
    # CUDA cannot run on it, so it yields no compute.
    return not (vendor == "nvidia" and detected_by == "sysfs")


def _hardware_observed(compute: str, facts: NodeFacts) -> bool:
    vendors = {g.vendor for g in facts.gpus if _gpu_has_driver(g.vendor, g.detected_by)}
    return {
        CPU: True,
        "cuda": "nvidia" in vendors,
        "rocm": "amd" in vendors,
        "metal": "apple" in vendors,
        "vulkan": bool(vendors),
    }.get(compute, False)


def _describe_gpus(facts: NodeFacts) -> str:
    if not facts.gpus:
        return "no GPU"
    return ", ".join(f"{g.vendor} {g.name!r} (via {g.detected_by})" for g in facts.gpus)


__all__ = [
    "BACKEND_OVERRIDE_CONFLICT",
    "ENGINES",
    "GPU_DETECTION_DEGRADED",
    "GPU_SERVING_DISABLED",
    "INVALID_ENGINE_BINARY",
    "INVALID_SLOT_SETTING",
    "DerivedBackends",
    "EngineSpec",
    "backends_env_var",
    "derive_node_backends",
    "parse_backend_declaration",
]
