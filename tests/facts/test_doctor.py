"""The node doctor: each check over hand-built inputs, and `skulk doctor` on a fresh data dir."""

from __future__ import annotations

import json
import os
import stat
from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

from skulk.cli import app
from skulk.datadir.lease import LeaseRecord
from skulk.datadir.paths import resolve_paths
from skulk.facts.derive import DerivedBackends, derive_node_backends
from skulk.facts.doctor import (
    CHECKS,
    FIX_CLUSTER_KEY,
    FIX_ENGINE_BUILD,
    FIX_KEY_PERMISSIONS,
    FIX_STORAGE,
    ClusterKeyState,
    DoctorInputs,
    LeaseState,
    PathState,
    check_capability_conflicts,
    check_cluster_key,
    check_dashboard,
    check_data_dir,
    check_engine_build,
    check_engines,
    check_lease,
    check_models_dir,
    check_storage_headroom,
    gather_doctor_inputs,
    has_errors,
    run_checks,
)
from skulk.provision.autoprovision import BuildInBackground, NoBuild
from skulk.shared.types.node_facts import EngineBinary, GpuFact, NodeFacts
from skulk.shared.types.telemetry import CapabilityConflict, EngineProvision

GiB = 1024**3
CPU_FACTS = NodeFacts(os="linux", machine="x86_64", importable={"llama_cpp": True, "mlx": True, "mlx_lm": True})
ROOT = Path("/data/skulk")
HOLDER = LeaseRecord(pid=42, host="box", node_id="node-a", api_endpoint="http://box:52415", acquired_at=0.0, expires_at=100.0)

HEALTHY = DoctorInputs(
    facts=CPU_FACTS,
    backends=derive_node_backends(CPU_FACTS),
    data_home=PathState(ROOT, exists=True, writable=True, free_bytes=100 * GiB),
    models_dir=PathState(ROOT / "models", exists=True, writable=True, free_bytes=100 * GiB),
    dashboard_dir=Path("/opt/dash"),
    dashboard_assets_present=True,
    cluster_key=ClusterKeyState(ROOT / "cluster.key", from_env=False, exists=True, mode=0o600),
    lease=LeaseState(ROOT / "skulk.lease", holder=None, held=False),
)


def test_a_healthy_node_is_all_ok() -> None:
    results = run_checks(HEALTHY)
    assert [r.check_id for r in results] == [c.id for c in CHECKS]
    assert all(r.verdict.status == "ok" for r in results)
    assert not has_errors(results)


def models(**changes) -> DoctorInputs:
    return replace(HEALTHY, models_dir=replace(HEALTHY.models_dir, **changes))


def key(**changes) -> DoctorInputs:
    return replace(HEALTHY, cluster_key=replace(HEALTHY.cluster_key, **changes))


NO_ENGINE_FACTS = NodeFacts(os="linux", machine="x86_64")
GPU_ON_CPU_FACTS = NodeFacts(
    os="linux",
    machine="x86_64",
    importable={"llama_cpp": True},
    llama_cpp_gpu_offload=False,
    gpus=[GpuFact(vendor="nvidia", name="NVIDIA H200", vram_total_bytes=141 * 10**9, detected_by="nvml")],
)


@pytest.mark.parametrize(
    ("check", "inputs", "status", "fix", "says"),
    [
        (check_engines, HEALTHY, "ok", None, "llama_cpp-cpu"),
        (check_engines, replace(HEALTHY, facts=NO_ENGINE_FACTS, backends=DerivedBackends()), "error", None, "no engine"),
        (check_data_dir, replace(HEALTHY, data_home=replace(HEALTHY.data_home, exists=False)), "warn", FIX_STORAGE, "does not exist"),
        (check_data_dir, replace(HEALTHY, data_home=replace(HEALTHY.data_home, writable=False)), "error", None, "not writable"),
        (check_models_dir, models(exists=False), "warn", FIX_STORAGE, "does not exist"),
        (check_models_dir, models(writable=False), "error", None, "not writable"),
        (check_storage_headroom, models(free_bytes=10 * GiB), "ok", None, "10.0 GiB free"),
        (check_storage_headroom, models(free_bytes=10 * GiB - 1), "warn", None, "reserve"),
        (check_storage_headroom, models(free_bytes=2 * GiB - 1), "error", None, "< 2 GiB"),
        # the node's configured download reserve, not the default, draws the warning line
        (check_storage_headroom, replace(models(free_bytes=10 * GiB), disk_reserve_bytes=20 * GiB), "warn", None,
         "< 20 GiB download reserve"),
        (check_storage_headroom, replace(models(free_bytes=5 * GiB), disk_reserve_bytes=4 * GiB), "ok", None,
         "5.0 GiB free"),
        (check_storage_headroom, models(free_bytes=None), "warn", None, "unreadable"),
        (check_dashboard, replace(HEALTHY, dashboard_assets_present=False), "warn", None, "headless"),
        (check_cluster_key, key(exists=False, mode=None), "warn", FIX_CLUSTER_KEY, "no cluster key"),
        (check_cluster_key, key(exists=False, mode=None, from_env=True), "ok", None, "SKULK_CLUSTER_KEY"),
        (check_cluster_key, key(empty=True), "error", None, "empty"),
        (check_cluster_key, key(mode=0o644), "warn", FIX_KEY_PERMISSIONS, "mode 644"),
        (check_lease, replace(HEALTHY, lease=LeaseState(ROOT, holder=HOLDER, held=True)), "ok", None, "pid 42 on box"),
        (check_lease, replace(HEALTHY, lease=LeaseState(ROOT, holder=HOLDER, held=False)), "ok", None, "stale"),
    ],
)
def test_check_verdicts(check, inputs: DoctorInputs, status: str, fix: str | None, says: str) -> None:
    (verdict,) = check(inputs)
    assert verdict.status == status
    assert verdict.fix == fix
    assert says in verdict.message
    if status != "ok":
        assert verdict.consequence and verdict.remediation


def test_each_capability_conflict_is_its_own_verdict() -> None:
    backends = derive_node_backends(GPU_ON_CPU_FACTS)
    assert backends.conflicts  # a visible GPU, a CPU-only build
    extra = CapabilityConflict(code="backend_override_conflict", level="warn", message="declared rocm", remediation="unset it")
    inputs = replace(HEALTHY, facts=GPU_ON_CPU_FACTS, backends=replace(backends, conflicts=[*backends.conflicts, extra]))
    verdicts = check_capability_conflicts(inputs)
    assert len(verdicts) == len(backends.conflicts) + 1
    assert verdicts[0].status == "error" and "gpu_serving_disabled" in verdicts[0].message
    assert verdicts[-1].status == "warn" and verdicts[-1].remediation == "unset it"
    assert has_errors(run_checks(inputs))


def test_gather_reads_key_mode_and_lease(tmp_path: Path) -> None:
    paths = resolve_paths({}, "linux", tmp_path, tmp_path / "node")
    paths.data_home.mkdir()
    paths.cluster_key_file.write_text("secret\n")
    os.chmod(paths.cluster_key_file, 0o640)
    record = replace(HOLDER, pid=os.getpid(), host="here", expires_at=1e12)
    paths.lease_file.write_text(json.dumps(record.__dict__))
    inputs = gather_doctor_inputs(paths, {}, facts=CPU_FACTS, now=1000.0, host="here")
    assert inputs.cluster_key.mode == 0o640 and not inputs.cluster_key.empty
    assert inputs.lease.held and inputs.lease.holder == record
    assert not inputs.models_dir.exists and inputs.models_dir.free_bytes is not None


def _doctor(*args: str) -> tuple[int, dict]:
    env = {name: None for name in ("SKULK_CLUSTER_KEY", "SKULK_HOME", "SKULK_MODELS_DIR", "SKULK_CACHE_HOME", "SKULK_CUSTOM_MODEL_CARDS_DIR")}
    result = CliRunner().invoke(app, ["doctor", "--json", *args], env=env)
    return result.exit_code, json.loads(result.stdout)


def _by_check(report: dict) -> dict[str, dict]:
    return {r["check"]: r for r in report["results"]}


def test_doctor_json_on_fresh_dir_names_what_is_missing_and_fix_repairs_it(tmp_path: Path) -> None:
    data_dir = tmp_path / "fresh"
    _, report = _doctor("--data-dir", str(data_dir))
    checks = _by_check(report)
    assert checks["models_dir"]["status"] == "warn" and checks["models_dir"]["fixable"]
    assert "skulk doctor --fix" in checks["models_dir"]["remediation"]
    assert checks["cluster_key"]["status"] == "warn" and "no cluster key" in checks["cluster_key"]["message"]
    assert report["fixed"] == []
    assert not data_dir.exists()  # a plain run changes nothing

    _, fixed = _doctor("--data-dir", str(data_dir), "--fix")
    assert fixed["fixed"] == [FIX_STORAGE, FIX_CLUSTER_KEY]
    checks = _by_check(fixed)
    for check_id in ("data_dir", "models_dir", "cluster_key"):
        assert checks[check_id]["status"] == "ok", checks[check_id]
    assert stat.S_IMODE((data_dir / "cluster.key").stat().st_mode) == 0o600

    _, again = _doctor("--data-dir", str(data_dir), "--fix")
    assert again["fixed"] == []  # idempotent


def test_doctor_fix_tightens_key_permissions(tmp_path: Path) -> None:
    data_dir = tmp_path / "node"
    _doctor("--data-dir", str(data_dir), "--fix")
    os.chmod(data_dir / "cluster.key", 0o644)
    _, report = _doctor("--data-dir", str(data_dir))
    assert _by_check(report)["cluster_key"]["status"] == "warn"
    _, fixed = _doctor("--data-dir", str(data_dir), "--fix")
    assert fixed["fixed"] == [FIX_KEY_PERMISSIONS]
    assert _by_check(fixed)["cluster_key"]["status"] == "ok"


def test_doctor_exits_non_zero_on_an_error(tmp_path: Path) -> None:
    key_file = tmp_path / "node" / "cluster.key"
    key_file.parent.mkdir()
    key_file.write_text("")
    code, report = _doctor("--data-dir", str(tmp_path / "node"))
    assert code == 1 and report["ok"] is False
    assert _by_check(report)["cluster_key"]["status"] == "error"


def test_check_list_for_docs_names_every_check() -> None:
    from skulk.facts.doctor import check_list_markdown

    text = check_list_markdown()
    assert all(f"`{check.id}`" in text and check.run.__doc__ for check in CHECKS)
    assert len(text.splitlines()) == len(CHECKS)


@pytest.mark.parametrize(
    ("binaries", "says"),
    [
        ({}, "llama-server: none (`skulk engines install` builds one)"),
        ({"llama_server": EngineBinary(path="/e/llama-server", state="usable", version="version: 1 (ab)", backend="cpu")},
         "llama-server /e/llama-server: usable (version: 1 (ab), cpu build)"),
        ({"llama_server": EngineBinary(path="/e/llama-server", state="broken")}, "llama-server /e/llama-server: broken"),
    ],
)
def test_doctor_reports_the_llama_server(binaries, says):
    inputs = replace(HEALTHY, facts=HEALTHY.facts.model_copy(update={"engine_binaries": binaries}))
    (verdict,) = check_engines(inputs)
    assert says in verdict.message


@pytest.mark.parametrize(
    ("engine_build", "running", "status", "says", "fix"),
    [
        (None, False, "ok", "not judged", None),
        (BuildInBackground("cpu"), False, "warn", "no native llama-server build for cpu", FIX_ENGINE_BUILD),
        (BuildInBackground("cuda"), True, "ok", "build is running", None),
        (NoBuild("a cpu build is installed"), False, "ok", "cpu build is installed", None),
        (NoBuild("no cmake", EngineProvision(state="skipped", backend="cpu", message="cmake not found: install it")),
         False, "warn", "cmake not found", None),
    ],
)
def test_check_engine_build(engine_build, running, status, says, fix) -> None:
    (verdict,) = check_engine_build(replace(HEALTHY, engine_build=engine_build, engine_build_running=running))
    assert (verdict.status, verdict.fix) == (status, fix)
    assert says in verdict.message


def test_extensions_check_warns_for_each_skipped_extension() -> None:
    from dataclasses import replace

    from skulk.extensions.contract import ExtensionShape
    from skulk.extensions.loader import ExtensionSet, LoadedExtension, SkippedExtension
    from skulk.facts.doctor import check_extensions

    loaded = LoadedExtension(shape=ExtensionShape(name="stamp", version="1.2", skulk_versions=">=0.1",
                                                  failure_policy="skip", hooks=()), obj=object(),
                             entry_point="stamp = stamp:make")
    skipped = SkippedExtension("old = old:make", "factory raised RuntimeError: boom")
    verdicts = check_extensions(replace(HEALTHY, extensions=ExtensionSet(loaded=(loaded,), skipped=(skipped,))))
    assert [v.status for v in verdicts] == ["ok", "warn"]
    assert "stamp 1.2 loads from stamp = stamp:make" in verdicts[0].message
    assert verdicts[1].message == "old = old:make is skipped: factory raised RuntimeError: boom"
    assert check_extensions(HEALTHY)[0].message == "none installed"
