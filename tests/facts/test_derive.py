import pytest

from skulk.facts.derive import INVALID_SLOT_SETTING, derive_node_backends, parse_backend_declaration
from skulk.shared.types.node_facts import EngineBinary, GpuFact, NodeFacts

CPU_ONLY = {"llama_cpp": True, "mlx": True, "mlx_lm": True}
NVIDIA = GpuFact(vendor="nvidia", name="NVIDIA H200", vram_total_bytes=141 * 10**9, detected_by="nvml")
NVIDIA_NODE = GpuFact(vendor="nvidia", name="NVIDIA GPU /dev/nvidia0", detected_by="device_node")
NVIDIA_NO_DRIVER = GpuFact(vendor="nvidia", name="NVIDIA GPU card0 (0x2330)", detected_by="sysfs")
AMD = GpuFact(vendor="amd", name="AMD GPU card0 (0x1586)", vram_total_bytes=512 * 2**20, detected_by="sysfs")
INTEL = GpuFact(vendor="intel", name="INTEL GPU card0", detected_by="sysfs")
APPLE = GpuFact(vendor="apple", name="Apple Silicon GPU", detected_by="apple_platform")


def facts(*, os="linux", machine="x86_64", gpus=(), importable=None, offload=None, binaries=None, env=None):
    return NodeFacts(
        os=os,
        machine=machine,
        gpus=list(gpus),
        importable=importable if importable is not None else {},
        llama_cpp_gpu_offload=offload,
        engine_binaries=binaries or {},
        declarations=env or {},
    )


USABLE_SERVER = {"llama_server": EngineBinary(path="/opt/llama-server", state="usable")}
USABLE_VLLM = {"vllm": EngineBinary(path="/opt/vllm", state="usable")}


@pytest.mark.parametrize(
    ("name", "node", "tags", "codes"),
    [
        (
            "linux cpu box (an RPC build reports offload True, no GPU to name)",
            facts(importable=CPU_ONLY, offload=True),
            ["llama_cpp", "llama_cpp-cpu", "mlx", "mlx-cpu"],
            [],
        ),
        ("macOS arm64 with mlx", facts(os="darwin", machine="arm64", gpus=[APPLE], importable={"mlx": True, "mlx_lm": True}), ["mlx", "mlx-metal"], []),
        (
            "macOS arm64 with mlx and llama_cpp",
            facts(os="darwin", machine="arm64", gpus=[APPLE], importable=CPU_ONLY, offload=True),
            ["llama_cpp", "llama_cpp-metal", "mlx", "mlx-metal"],
            [],
        ),
        (
            "macOS arm64 with the speech engines: they serve on its CPU (no Metal in CTranslate2 or Piper)",
            facts(os="darwin", machine="arm64", gpus=[APPLE],
                  importable={"mlx": True, "mlx_lm": True, "faster_whisper": True, "piper": True}),
            ["mlx", "mlx-metal", "faster_whisper", "faster_whisper-cpu", "piper", "piper-cpu"],
            [],
        ),
        (
            "macOS arm64 with mlx-whisper: Whisper in MLX's layout on Metal, beside faster-whisper on its CPU",
            facts(os="darwin", machine="arm64", gpus=[APPLE],
                  importable={"mlx": True, "mlx_lm": True, "faster_whisper": True, "mlx_whisper": True}),
            ["mlx", "mlx-metal", "faster_whisper", "faster_whisper-cpu", "mlx_whisper", "mlx_whisper-metal"],
            [],
        ),
        ("linux with mlx-whisper: MLX's CPU backend", facts(importable={"mlx": True, "mlx_whisper": True}),
         ["mlx_whisper", "mlx_whisper-cpu"], []),
        ("mlx-whisper without mlx is not advertised", facts(importable={"mlx_whisper": True}), [], []),
        ("nvidia + GPU llama_cpp build", facts(gpus=[NVIDIA], importable={"llama_cpp": True}, offload=True), ["llama_cpp", "llama_cpp-cuda"], []),
        (
            "nvidia + CPU-only llama_cpp build: the build wins, loudly",
            facts(gpus=[NVIDIA], importable={"llama_cpp": True}, offload=False),
            ["llama_cpp", "llama_cpp-cpu"],
            ["gpu_serving_disabled"],
        ),
        (
            "nvidia + only mlx on linux: everything on CPU",
            facts(gpus=[NVIDIA], importable={"mlx": True, "mlx_lm": True}),
            ["mlx", "mlx-cpu"],
            ["gpu_serving_disabled"],
        ),
        (
            "declaration beats the build's report",
            facts(gpus=[NVIDIA], importable={"llama_cpp": True}, offload=False, env={"SKULK_LLAMA_CPP_BACKENDS": "cuda,cpu"}),
            ["llama_cpp", "llama_cpp-cuda", "llama_cpp-cpu"],
            [],
        ),
        (
            "declared hardware not observed: honoured, warned",
            facts(importable={"llama_cpp": True}, offload=True, env={"SKULK_LLAMA_CPP_BACKENDS": "cuda"}),
            ["llama_cpp", "llama_cpp-cuda"],
            ["backend_override_conflict"],
        ),
        (
            "full tags in a declaration",
            facts(gpus=[AMD], importable={"llama_cpp": True}, offload=True, env={"SKULK_LLAMA_CPP_BACKENDS": " llama_cpp-rocm , llama_cpp "}),
            ["llama_cpp", "llama_cpp-rocm"],
            [],
        ),
        (
            "unknown declared compute ignored; nothing valid left falls through",
            facts(importable={"llama_cpp": True}, offload=False, env={"SKULK_LLAMA_CPP_BACKENDS": "tpu"}),
            ["llama_cpp", "llama_cpp-cpu"],
            ["backend_override_conflict"],
        ),
        (
            "declared engine that cannot load is not advertised",
            facts(importable={"mlx": True, "mlx_lm": True}, env={"SKULK_LLAMA_CPP_BACKENDS": "cpu"}),
            ["mlx", "mlx-cpu"],
            ["backend_override_conflict"],
        ),
        (
            "nvidia device node without NVML: cuda inferred, degraded",
            facts(gpus=[NVIDIA_NODE], importable={"llama_cpp": True}, offload=True),
            ["llama_cpp", "llama_cpp-cuda"],
            ["gpu_detection_degraded"],
        ),
        (
            "nvidia card without its driver: no CUDA, loudly",
            facts(gpus=[NVIDIA_NO_DRIVER], importable={"llama_cpp": True}, offload=True),
            ["llama_cpp", "llama_cpp-cpu"],
            ["gpu_serving_disabled"],
        ),
        ("amd: the vulkan lane", facts(gpus=[AMD], importable={"llama_cpp": True}, offload=True), ["llama_cpp", "llama_cpp-vulkan"], []),
        ("an intel iGPU is no serving GPU", facts(gpus=[INTEL], importable={"llama_cpp": True}, offload=True), ["llama_cpp", "llama_cpp-cpu"], []),
        ("usable llama-server on nvidia", facts(gpus=[NVIDIA], binaries=USABLE_SERVER), ["llama_server", "llama_server-cuda"], []),
        (
            "llama-server declaration",
            facts(gpus=[NVIDIA], binaries=USABLE_SERVER, env={"SKULK_LLAMA_SERVER_BACKENDS": "vulkan"}),
            ["llama_server", "llama_server-vulkan"],
            [],
        ),
        (
            "broken binary override",
            facts(importable={"llama_cpp": True}, offload=True, binaries={"llama_server": EngineBinary(path="/nope", state="missing")}),
            ["llama_cpp", "llama_cpp-cpu"],
            ["invalid_engine_binary"],
        ),
        ("vllm on nvidia", facts(gpus=[NVIDIA], binaries=USABLE_VLLM), ["vllm", "vllm-cuda"], []),
        ("vllm on amd", facts(gpus=[AMD], binaries=USABLE_VLLM), ["vllm", "vllm-rocm"], []),
        ("vllm without a GPU: GPU-only, not advertised", facts(binaries=USABLE_VLLM), [], []),
        ("mlx without mlx_lm cannot serve", facts(importable={"mlx": True, "mlx_lm": False}), [], []),
        ("nothing installed", facts(gpus=[NVIDIA]), [], []),
    ],
)
def test_derive_node_backends(name, node, tags, codes):
    derived = derive_node_backends(node)
    assert derived.tags == tags
    assert [c.code for c in derived.conflicts] == codes


@pytest.mark.parametrize(
    ("code", "level"),
    [
        ("gpu_serving_disabled", "error"),
        ("gpu_detection_degraded", "warn"),
        ("invalid_engine_binary", "warn"),
        ("backend_override_conflict", "warn"),
    ],
)
def test_conflict_levels(code, level):
    node = facts(
        gpus=[NVIDIA_NODE],
        importable={"llama_cpp": True, "mlx": True, "mlx_lm": True},
        offload=False,
        binaries={"llama_server": EngineBinary(path="/bin/ls.d", state="not_executable")},
        env={"SKULK_MLX_BACKENDS": "cpu,tpu"},
    )
    (conflict,) = [c for c in derive_node_backends(node).conflicts if c.code == code]
    assert conflict.level == level
    assert conflict.remediation


def test_gpu_serving_disabled_names_observed_gpu_and_why():
    node = facts(gpus=[NVIDIA], importable={"llama_cpp": True}, offload=False)
    (conflict,) = derive_node_backends(node).conflicts
    assert "NVIDIA H200" in conflict.message
    assert "llama_cpp-cpu" in conflict.message
    assert "reports no GPU offload" in conflict.message
    assert "CUDA" in conflict.remediation


def test_override_conflict_carries_declared_and_observed_values():
    node = facts(importable={"llama_cpp": True}, offload=True, env={"SKULK_LLAMA_CPP_BACKENDS": "cuda,cpu"})
    (conflict,) = derive_node_backends(node).conflicts
    assert "SKULK_LLAMA_CPP_BACKENDS='cuda,cpu'" in conflict.message
    assert "['cuda']" in conflict.message and "no GPU" in conflict.message
    assert "honoured" in conflict.message


def test_invalid_binary_names_the_env_var_and_path():
    node = facts(binaries={"llama_server": EngineBinary(path="/opt/missing", state="missing")})
    (conflict,) = derive_node_backends(node).conflicts
    assert "SKULK_LLAMA_SERVER_BIN='/opt/missing'" in conflict.message
    assert "SKULK_LLAMA_SERVER_BIN" in conflict.remediation


@pytest.mark.parametrize(
    ("engine", "raw", "computes", "invalid"),
    [
        ("llama_cpp", "cuda,cpu", ("cuda", "cpu"), ()),
        ("llama_cpp", " CUDA , cuda ,", ("cuda",), ()),
        ("llama_cpp", "llama_cpp-vulkan,llama_cpp", ("vulkan",), ()),
        ("llama_cpp", "mlx-metal,tpu", (), ("mlx-metal", "tpu")),
        ("mlx", "", (), ()),
    ],
)
def test_parse_backend_declaration(engine, raw, computes, invalid):
    assert parse_backend_declaration(engine, raw) == (computes, invalid)


def test_derivation_is_pure_and_repeatable():
    node = facts(gpus=[NVIDIA_NODE, AMD], importable=CPU_ONLY, offload=True)
    assert derive_node_backends(node) == derive_node_backends(node)


MANAGED_CPU_SERVER = {"llama_server": EngineBinary(path="/e/bin/llama-server", state="usable", backend="cpu")}
MANAGED_CUDA_SERVER = {"llama_server": EngineBinary(path="/e/bin/llama-server", state="usable", backend="cuda")}


@pytest.mark.parametrize(
    ("name", "node", "tags", "codes"),
    [
        ("managed cpu build on a cpu box", facts(binaries=MANAGED_CPU_SERVER), ["llama_server", "llama_server-cpu"], []),
        (
            "managed cpu build on an NVIDIA node: cpu, loudly",
            facts(gpus=[NVIDIA], binaries=MANAGED_CPU_SERVER),
            ["llama_server", "llama_server-cpu"],
            ["gpu_serving_disabled"],
        ),
        ("managed cuda build on an NVIDIA node", facts(gpus=[NVIDIA], binaries=MANAGED_CUDA_SERVER), ["llama_server", "llama_server-cuda"], []),
        (
            "a binary that does not answer --version is not advertised",
            facts(binaries={"llama_server": EngineBinary(path="/e/llama-server", state="broken")}),
            [],
            ["invalid_engine_binary"],
        ),
    ],
)
def test_llama_server_from_its_binary(name, node, tags, codes):
    derived = derive_node_backends(node)
    assert derived.tags == tags, name
    assert [c.code for c in derived.conflicts] == codes, name


def test_cpu_build_on_gpu_node_names_the_cuda_install_command():
    (conflict,) = derive_node_backends(facts(gpus=[NVIDIA], binaries=MANAGED_CPU_SERVER)).conflicts
    assert "skulk engines install --backend cuda" in conflict.remediation


def test_broken_binary_says_it_does_not_answer():
    node = facts(binaries={"llama_server": EngineBinary(path="/e/llama-server", state="broken")})
    (conflict,) = derive_node_backends(node).conflicts
    assert "does not answer --version" in conflict.message


# -- served-engine slot settings -----------------------------------------------------------


def _served_facts(**declarations: str) -> NodeFacts:
    return NodeFacts(
        os="linux", machine="x86_64", importable={"llama_cpp": True},
        engine_binaries={"llama_server": EngineBinary(path="/e/llama-server", state="usable")},
        declarations=declarations,
    )


def test_a_valid_slot_setting_is_advertised():
    derived = derive_node_backends(_served_facts(SKULK_LLAMA_SERVER_PARALLEL="8"))
    assert "llama_server-cpu" in derived.tags
    assert derived.slots["llama_server"] == 8
    assert not [c for c in derived.conflicts if c.code == INVALID_SLOT_SETTING]


@pytest.mark.parametrize("raw", ["0", "many", "65"])
def test_an_invalid_slot_setting_withdraws_the_engine_with_an_error(raw):
    derived = derive_node_backends(_served_facts(SKULK_LLAMA_SERVER_PARALLEL=raw))
    assert not any(tag.startswith("llama_server") for tag in derived.tags)
    assert "llama_cpp-cpu" in derived.tags  # the other engines are untouched
    assert "llama_server" not in derived.slots
    (conflict,) = [c for c in derived.conflicts if c.code == INVALID_SLOT_SETTING]
    assert conflict.level == "error"
    assert f"SKULK_LLAMA_SERVER_PARALLEL={raw!r}" in conflict.message and "not advertised" in conflict.message
