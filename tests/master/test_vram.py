"""VRAM admission: a GGUF placed on an NVIDIA node's GPU backend is planned on VRAM (layers
that do not fit shed to RAM) and its context is stamped from VRAM, from recorded NVML
snapshots; the engines load the planned n_gpu_layers."""

import itertools

import pytest

from skulk.facts.nvml import NvmlDevice, gpu_readings
from skulk.master.placement import PlacementRequest, place
from skulk.models.cards import builtin_cards_dir, resolve_cards
from skulk.shared.memory_estimate import admission_context_tokens
from skulk.shared.types.state import NodeInfo, State
from skulk.shared.types.telemetry import DiskReading, MemoryReading, NodeResources
from skulk.worker.engines.base import ShardSpec
from skulk.worker.engines.llama_cpp.engine import planned_gpu_layers

GB = 10**9
GGUF_8B = resolve_cards(builtin_cards_dir(), None).cards["bartowski/Meta-Llama-3.1-8B-Instruct-GGUF"]
ONE_H200 = gpu_readings([NvmlDevice(0, "NVIDIA H200", 150 * GB, 149 * GB, 0, 31, 76_000)])
TWO_L4 = gpu_readings([NvmlDevice(0, "NVIDIA L4", 24 * GB, 23 * GB), NvmlDevice(1, "NVIDIA L4", 24 * GB, 23 * GB)])
SMALL_GPU = gpu_readings([NvmlDevice(0, "NVIDIA T400", 4 * GB, 3 * GB)])
CUDA = ("llama_cpp", "llama_cpp-cuda")


def node(gpus, backends=CUDA):
    return NodeResources(
        node_id="a", node_name="a", version="0",
        memory=MemoryReading(ram_total_bytes=64 * GB, ram_available_bytes=48 * GB),
        disk=DiskReading(models_dir="/m", total_bytes=10**12, free_bytes=10**12),
        backends=list(backends), gpus=gpus,
    )


def placed(resources):
    counter = itertools.count()
    state = State(nodes={"a": NodeInfo(node_id="a", node_name="a", version="0")})
    return place(GGUF_8B, state, {"a": resources}, PlacementRequest(model_id=GGUF_8B.model_id),
                 new_id=lambda: f"id{next(counter)}")


@pytest.mark.parametrize(
    ("name", "resources", "device", "all_layers_on_gpu"),
    [
        ("one big GPU holds every layer", node(ONE_H200), "vram", True),
        ("two GPUs pool their VRAM", node(TWO_L4), "vram", True),
        ("a small GPU: layers that do not fit are shed to RAM", node(SMALL_GPU), "vram", False),
        ("a CPU tag is planned on RAM even beside a GPU", node(ONE_H200, ("llama_cpp", "llama_cpp-cpu")), "ram", True),
        ("no VRAM reading: RAM, as before", node([]), "ram", True),
    ],
)
def test_gpu_nodes_are_planned_on_vram(name, resources, device, all_layers_on_gpu):
    instance = placed(resources)
    (shard,) = instance.capacity.shards
    assert shard.device_kind == device, name
    assert (shard.gpu_layers == GGUF_8B.num_layers) is all_layers_on_gpu, (name, shard.gpu_layers)
    if device == "vram" and not all_layers_on_gpu:
        assert 0 < shard.gpu_layers < GGUF_8B.num_layers


def test_context_is_stamped_from_vram_not_the_floor():
    floor = admission_context_tokens(GGUF_8B)
    assert placed(node([])).context_token_limit == floor
    assert placed(node(ONE_H200)).context_token_limit > floor


@pytest.mark.parametrize(
    ("resources", "layers"),
    [(node(ONE_H200), GGUF_8B.num_layers), (node([]), -1), (node(ONE_H200, ("llama_cpp", "llama_cpp-cpu")), 0)],
)
def test_engines_load_the_planned_gpu_layers(resources, layers):
    instance = placed(resources)
    spec = ShardSpec(instance=instance, runner_id=instance.shards[0].runner_id, card=GGUF_8B, model_path="/m.gguf")
    if resources.gpus and instance.shards[0].backend.endswith("cuda"):
        assert planned_gpu_layers(spec) == instance.capacity.shards[0].gpu_layers == layers
    else:
        assert planned_gpu_layers(spec) == layers


def test_shed_layers_reach_the_engine():
    instance = placed(node(SMALL_GPU))
    spec = ShardSpec(instance=instance, runner_id=instance.shards[0].runner_id, card=GGUF_8B, model_path="/m.gguf")
    assert 0 < planned_gpu_layers(spec) < GGUF_8B.num_layers
