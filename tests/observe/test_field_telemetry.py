"""Field telemetry's pure core: the switch, the allowlist, the hardware of a generation,
the peer-observed loss, and the bounded queue as data. One table per rule."""

from __future__ import annotations

import json

import pytest

from skulk.observe.field_telemetry import (
    CUSTOM_MODEL,
    MAX_PENDING_SAMPLES,
    GenerationSample,
    NodeLostSample,
    Pending,
    StreamEnded,
    TelemetryBatch,
    admit,
    after_send,
    cleared,
    decode_tokens_per_s,
    env_disables_telemetry,
    failure_class,
    generation_sample,
    next_batch,
    node_lost_sample,
    public_hardware,
    public_model_id,
    send_result,
    serving_hardware,
    telemetry_enabled,
)
from skulk.shared.types.events import NodeJoined, NodeLeft, NodeTimedOut
from skulk.shared.types.instances import Instance, ShardAssignment
from skulk.shared.types.state import State
from skulk.shared.types.tasks import TextGeneration, TextGenerationParams

BUILTIN = frozenset({"local/tiny-llama-gguf", "Qwen/Qwen2.5-0.5B-Instruct-GGUF"})


# -- the switch --

@pytest.mark.parametrize(
    ("configured", "consent", "env_disabled", "enabled"),
    [
        (False, None, False, False),  # the default: off
        (True, None, False, True),  # opted in in skulk.yaml
        (False, True, False, True),  # opted in with the dashboard's switch
        (True, False, False, False),  # opted out with the switch
        (True, None, True, False),  # the environment wins over the file...
        (False, True, True, False),  # ...over the switch...
        (True, True, True, False),  # ...over both
        (False, False, True, False),
    ],
)
def test_telemetry_enabled(configured, consent, env_disabled, enabled):
    assert telemetry_enabled(configured, consent, env_disabled) is enabled


@pytest.mark.parametrize(
    ("value", "disabled"),
    [(None, False), ("", False), ("0", False), ("false", False), ("OFF", False), ("no", False),
     ("1", True), ("true", True), ("yes", True), ("please", True)],
)
def test_env_disables_telemetry(value, disabled):
    env = {} if value is None else {"SKULK_TELEMETRY_DISABLE": value}
    assert env_disables_telemetry(env) is disabled


# -- the allowlist --

@pytest.mark.parametrize(
    ("model_id", "sent"),
    [("local/tiny-llama-gguf", "local/tiny-llama-gguf"),
     ("Qwen/Qwen2.5-0.5B-Instruct-GGUF", "Qwen/Qwen2.5-0.5B-Instruct-GGUF"),
     ("acme-corp/secret-finetune", CUSTOM_MODEL),  # a hub id may name a private repo
     ("local/my-own-card", CUSTOM_MODEL),
     ("/home/alice/models/x.gguf", CUSTOM_MODEL),
     ("", CUSTOM_MODEL)],
)
def test_public_model_id(model_id, sent):
    assert public_model_id(model_id, BUILTIN) == sent


@pytest.mark.parametrize(
    ("outcome", "error_type", "failure"),
    [("completed", None, None), ("cancelled", "cancelled", None), ("client_closed", "client_closed", None),
     ("failed", "NodeLost", "NodeLost"), ("failed", "idle_timeout", "idle_timeout"),
     ("failed", "ContextLengthExceeded", "ContextLengthExceeded"),
     ("failed", "ValueError: /home/alice/prompt.txt", "other"), ("failed", None, "other")],
)
def test_failure_class(outcome, error_type, failure):
    assert failure_class(outcome, error_type) == failure


@pytest.mark.parametrize(
    ("classes", "sent"),
    [(["nvidia-rtx-4090-24gb", "apple-m4-24gb"], ["apple-m4-24gb", "nvidia-rtx-4090-24gb"]),
     ([None], ["unknown"]), (["studio.local"], ["unknown"]), (["10.0.0.2"], ["unknown"]), ([], []),
     (["a"] * 40, ["a"] * 16)],
)
def test_public_hardware(classes, sent):
    assert public_hardware(classes) == sent


def ended(**fields) -> StreamEnded:
    base = dict(command_id="cmd-secret", model_id="local/tiny-llama-gguf", workload="text", outcome="completed",
                first_output_s=0.25, decode_s=2.0, output_chunks=9, prompt_tokens=12, completion_tokens=9,
                cached_tokens=4)
    return StreamEnded(**{**base, **fields})


@pytest.mark.parametrize(
    ("fields", "tokens_per_s"),
    [({}, 4.0), ({"completion_tokens": 0}, 4.0), ({"completion_tokens": 1, "output_chunks": 1}, None),
     ({"decode_s": 0.0}, None), ({"decode_s": None}, None), ({"completion_tokens": 21, "decode_s": 3.0}, 6.67)],
)
def test_decode_speed(fields, tokens_per_s):
    assert decode_tokens_per_s(ended(**fields)) == tokens_per_s


def test_a_generation_sample_holds_the_allowed_fields_only():
    sample = generation_sample(ended(model_id="acme/private-repo", outcome="failed", error_type="Boom at 10.0.0.2"),
                               BUILTIN, ["linux-x86_64-cpu-24gb", "studio.example.com"])
    assert sample is not None
    wire = json.loads(sample.model_dump_json(by_alias=True))
    assert wire == {
        "kind": "generation", "model": "custom", "hardware": ["linux-x86_64-cpu-24gb", "unknown"],
        "outcome": "failed", "failure": "other", "ttftMs": 250, "decodeTokensPerS": 4.0,
        "promptTokens": 12, "completionTokens": 9, "cachedTokens": 4,
    }
    text = json.dumps(wire)
    for secret in ("cmd-secret", "acme", "private-repo", "10.0.0.2", "studio", "Boom"):
        assert secret not in text


@pytest.mark.parametrize(
    ("fields", "sampled"),
    [({}, True), ({"outcome": "failed", "error_type": "NodeLost"}, True), ({"outcome": "client_closed"}, True),
     ({"workload": "embeddings"}, False), ({"workload": "echo"}, False), ({"outcome": "exploded"}, False)],
)
def test_which_streams_are_sampled(fields, sampled):
    assert (generation_sample(ended(**fields), BUILTIN, []) is not None) is sampled


def test_a_stream_without_output_has_no_timings():
    sample = generation_sample(ended(outcome="failed", error_type="NodeLost", first_output_s=None, decode_s=None,
                                     output_chunks=0, completion_tokens=0), BUILTIN, [])
    assert sample is not None
    assert (sample.ttft_ms, sample.decode_tokens_per_s, sample.completion_tokens) == (None, None, 0)


# -- peer-observed losses --

def timed_out(cause="silence") -> NodeTimedOut:
    return NodeTimedOut(event_id="e", node_id="dead", last_event_age_s=40, effective_age_s=31, timeout_s=30,
                        cause=cause)


@pytest.mark.parametrize(
    ("event", "i_am_master", "hardware", "sample"),
    [
        (timed_out(), True, {"dead": "apple-m4-24gb"}, NodeLostSample(hardware="apple-m4-24gb", cause="silence")),
        (timed_out("presence_lost"), True, {"dead": "nvidia-rtx-4090-24gb"},
         NodeLostSample(hardware="nvidia-rtx-4090-24gb", cause="presence_lost")),
        (timed_out(), True, {}, NodeLostSample(hardware="unknown", cause="silence")),
        (timed_out(), True, {"dead": "Alice's Mac"}, NodeLostSample(hardware="unknown", cause="silence")),
        (timed_out(), False, {"dead": "apple-m4-24gb"}, None),  # only the master counts it: once
        (NodeLeft(event_id="e", node_id="dead"), True, {"dead": "apple-m4-24gb"}, None),  # a clean stop
        (NodeJoined(event_id="e", node_id="n", node_name="studio", version="1"), True, {}, None),
    ],
)
def test_node_lost_sample(event, i_am_master, hardware, sample):
    assert node_lost_sample(event, i_am_master, hardware) == sample


def instance(instance_id: str, *nodes: str) -> Instance:
    return Instance(instance_id=instance_id, model_id="m", sharding="Pipeline", context_token_limit=2048, shards=[
        ShardAssignment(node_id=n, runner_id=f"r-{instance_id}-{i}", rank=i, world_size=len(nodes), start_layer=i,
                        end_layer=i + 1, backend="llama_cpp-cpu") for i, n in enumerate(nodes)])


STATE = State(
    instances={"i1": instance("i1", "a"), "i2": instance("i2", "b", "c")},
    tasks={"t1": TextGeneration(task_id="t1", instance_id="i2", command_id="cmd", owner_node_id="a",
                                params=TextGenerationParams(model_id="m", prompt="hello"))},
)
HARDWARE = {"a": "apple-m4-24gb", "b": "nvidia-rtx-4090-24gb", "c": "linux-x86_64-cpu-32gb"}


@pytest.mark.parametrize(
    ("command_id", "model_id", "classes"),
    [("cmd", "m", ["nvidia-rtx-4090-24gb", "linux-x86_64-cpu-32gb"]),  # the task's own instance
     ("gone", "m", ["apple-m4-24gb"]),  # task already deleted: the model's first instance
     ("gone", "other", [])],
)
def test_serving_hardware(command_id, model_id, classes):
    assert serving_hardware(STATE, HARDWARE, command_id, model_id) == classes


# -- the queue --

def sample(n: int = 0) -> GenerationSample:
    return GenerationSample(model="custom", hardware=[], outcome="completed", prompt_tokens=n)


def test_a_full_queue_drops_the_new_sample_and_counts_it():
    pending = Pending(samples=tuple(sample(i) for i in range(3)))
    full = admit(pending, sample(3), capacity=3)
    assert full.samples == pending.samples and full.dropped == 1
    assert admit(Pending(), sample()).samples == (sample(),)
    assert MAX_PENDING_SAMPLES >= 100


def test_the_batch_is_the_oldest_samples_with_the_drops():
    pending = Pending(samples=tuple(sample(i) for i in range(5)), dropped=2)
    batch = next_batch(pending, "install", "9.9", max_samples=3)
    assert batch == TelemetryBatch(install_id="install", skulk_version="9.9", samples=[sample(0), sample(1), sample(2)],
                                   dropped=2)
    assert set(json.loads(batch.model_dump_json(by_alias=True))) == {
        "schemaVersion", "installId", "skulkVersion", "samples", "dropped"}


@pytest.mark.parametrize(
    ("status", "result"),
    [(200, "sent"), (202, "sent"), (204, "sent"), (None, "retry"), (500, "retry"), (503, "retry"), (429, "retry"),
     (408, "retry"), (400, "refused"), (404, "refused"), (413, "refused"), (301, "refused")],
)
def test_send_result(status, result):
    assert send_result(status) == result


PENDING = Pending(samples=tuple(sample(i) for i in range(4)), dropped=3, epoch=7)
BATCH = next_batch(PENDING, "i", "v", max_samples=2)
LATER = Pending(samples=(*PENDING.samples, sample(9)), dropped=4, epoch=7)  # one more sample, one more drop


@pytest.mark.parametrize(
    ("pending", "result", "epoch", "after"),
    [
        (LATER, "sent", 7, Pending(samples=(sample(2), sample(3), sample(9)), dropped=1, epoch=7)),
        (LATER, "retry", 7, LATER),
        (LATER, "refused", 7, Pending(samples=(sample(2), sample(3), sample(9)), dropped=6, epoch=7)),
        (cleared(LATER), "sent", 7, cleared(LATER)),  # turned off meanwhile: nothing new is lost
    ],
)
def test_after_send(pending, result, epoch, after):
    assert after_send(pending, BATCH, result, epoch) == after


def test_clearing_forgets_everything():
    assert cleared(PENDING) == Pending(epoch=8)
