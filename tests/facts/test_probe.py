import os
import stat

import pytest

from skulk.facts import probe
from skulk.facts.derive import derive_node_backends
from skulk.facts.probe import probe_node_facts
from skulk.shared.types.node_facts import NodeFacts


def test_probe_on_this_box():
    facts = probe_node_facts({})
    assert isinstance(facts, NodeFacts)
    assert facts.os and facts.machine
    assert facts.importable["llama_cpp"] and facts.importable["mlx"] and facts.importable["mlx_lm"]
    assert isinstance(facts.llama_cpp_gpu_offload, bool)
    assert NodeFacts.model_validate(facts.to_wire()) == facts  # crosses the wire intact
    tags = derive_node_backends(facts).tags
    assert "llama_cpp" in tags and "mlx" in tags


@pytest.fixture
def fake_root(tmp_path, monkeypatch):
    monkeypatch.setattr(probe, "_nvml_gpus", lambda: None)  # as on a box without nvidia-ml-py
    (tmp_path / "dev").mkdir()
    for name in ("nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm"):
        (tmp_path / "dev" / name).touch()
    drm = tmp_path / "sys" / "class" / "drm"
    for card, vendor, extra in (
        ("card0", "0x1002", {"device": "0x1586", "mem_info_vram_total": "536870912"}),
        ("card1", "0x8086", {}),
        ("card2", "0x10de", {}),  # the NVIDIA card again, already seen via /dev
        ("card3", "0x1a03", {}),  # a BMC's display adapter: not a GPU we know
    ):
        (drm / card / "device").mkdir(parents=True)
        (drm / card / "device" / "vendor").write_text(vendor + "\n")
        for name, value in extra.items():
            (drm / card / "device" / name).write_text(value + "\n")
    (drm / "card0-DP-1").mkdir()
    return tmp_path


def test_probe_reads_device_nodes_and_sysfs(fake_root):
    facts = probe_node_facts({}, fs_root=fake_root)
    seen = [(g.vendor, g.detected_by, g.vram_total_bytes) for g in facts.gpus]
    assert seen == [
        ("nvidia", "device_node", None),
        ("nvidia", "device_node", None),
        ("amd", "sysfs", 536870912),
        ("intel", "sysfs", None),
    ]
    assert "gpu_detection_degraded" in [c.code for c in derive_node_backends(facts).conflicts]


def _write(path, mode):
    path.write_text("#!/bin/sh\n")
    path.chmod(mode)
    return str(path)


def test_probe_engine_binaries_and_declarations(tmp_path):
    exe = _write(tmp_path / "llama-server", stat.S_IRWXU)
    not_exe = _write(tmp_path / "vllm", stat.S_IRUSR)
    env = {
        "SKULK_LLAMA_SERVER_BIN": exe,
        "SKULK_VLLM_BIN": not_exe,
        "SKULK_LLAMA_CPP_BACKENDS": " cuda, cpu ",
        "SKULK_LLAMA_SERVER_PARALLEL": "16",
        "SKULK_CLUSTER_KEY": "secret",
        "HOME": "/root",
    }
    facts = probe_node_facts(env, fs_root=tmp_path)
    assert {e: b.state for e, b in facts.engine_binaries.items()} == {"llama_server": "usable", "vllm": "not_executable"}
    assert facts.declarations == {
        "SKULK_LLAMA_CPP_BACKENDS": " cuda, cpu ",
        "SKULK_LLAMA_SERVER_BIN": exe,
        "SKULK_LLAMA_SERVER_PARALLEL": "16",
        "SKULK_VLLM_BIN": not_exe,
    }


@pytest.mark.parametrize(
    ("value", "state"),
    [("/definitely/not/here", "missing"), ("llama-server", "usable"), ("no-such-command-xyz", "missing"), ("/", "not_executable")],
)
def test_binary_states(tmp_path, value, state):
    _write(tmp_path / "llama-server", stat.S_IRWXU)
    env = {"SKULK_LLAMA_SERVER_BIN": value, "PATH": str(tmp_path) + os.pathsep + "/nonexistent"}
    assert probe_node_facts(env, fs_root=tmp_path).engine_binaries["llama_server"].state == state


def test_a_failing_step_costs_only_that_step(tmp_path, monkeypatch):
    def broken(*_args):
        raise RuntimeError("odd machine")

    monkeypatch.setattr(probe, "_gpus", broken)
    monkeypatch.setattr(probe, "_declarations", broken)
    facts = probe_node_facts({"SKULK_VLLM_BIN": "/nope"}, fs_root=tmp_path)
    assert facts.gpus == [] and facts.declarations == {}
    assert facts.engine_binaries["vllm"].state == "missing"


def test_a_failing_llama_cpp_report_is_unknown(monkeypatch):
    import llama_cpp

    def broken():
        raise OSError("bad build")

    monkeypatch.setattr(llama_cpp, "llama_supports_gpu_offload", broken)
    assert probe_node_facts({}).llama_cpp_gpu_offload is None


def test_a_binary_that_fails_version_is_broken(tmp_path):
    failing = tmp_path / "llama-server"
    failing.write_text("#!/bin/sh\nexit 3\n")
    failing.chmod(stat.S_IRWXU)
    binary = probe_node_facts({"SKULK_LLAMA_SERVER_BIN": str(failing)}, fs_root=tmp_path).engine_binaries["llama_server"]
    assert binary.state == "broken" and binary.version is None


def test_a_managed_binary_carries_its_backend_and_version(tmp_path):
    server = tmp_path / "llama-server"
    server.write_text("#!/bin/sh\necho 'version: 1 (abc)'\n")
    server.chmod(stat.S_IRWXU)
    env = {"SKULK_LLAMA_SERVER_BIN": str(server), "SKULK_LLAMA_SERVER_MANAGED_BACKEND": "cpu"}
    binary = probe_node_facts(env, fs_root=tmp_path).engine_binaries["llama_server"]
    assert (binary.state, binary.version, binary.backend) == ("usable", "version: 1 (abc)", "cpu")
