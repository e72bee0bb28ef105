"""The cluster client's pure core: errors decoded from every wire shape, rows, targets."""

from __future__ import annotations

import json

import pytest

from skulk.client.views import (
    ChatDelta,
    ClientError,
    chat_delta,
    error_from_response,
    instance_problems,
    instance_rows,
    node_rows,
    preview_rows,
    resolve_nodes,
    unplace_targets,
)

STATE = {
    "nodes": {"aaaa1111": {"nodeName": "alpha"}, "bbbb2222": {"nodeName": "beta"}},
    "instances": {
        "i1": {"modelId": "m/one", "sharding": "Pipeline", "contextTokenLimit": 2048,
               "shards": [{"nodeId": "aaaa1111", "runnerId": "r1"}]},
        "i2": {"modelId": "m/one", "sharding": "Pipeline", "contextTokenLimit": 2048,
               "shards": [{"nodeId": "bbbb2222", "runnerId": "r2"}]},
        "i3": {"modelId": "m/two", "sharding": "Tensor", "shards": [{"nodeId": "aaaa1111", "runnerId": "r3"}]},
    },
    "runners": {"r1": {"state": "Ready"}, "r2": {"state": "Loading"}},
    "nodeHealth": {"bbbb2222": {"level": "error", "reasons": [{"message": "heartbeat late", "remediation": "x"}]}},
}


@pytest.mark.parametrize(("status", "body", "expected"), [
    (400, {"error": {"code": "exclusions_removed_all", "message": "exclude fewer"}},
     ClientError(400, "exclusions_removed_all", "exclude fewer")),
    (404, {"error": {"message": "no model", "type": "invalid_request_error", "code": "model_not_found"}},
     ClientError(404, "model_not_found", "no model")),
    (401, {"type": "error", "error": {"type": "authentication_error", "message": "key"}},
     ClientError(401, "authentication_error", "key")),
    (404, {"error": "ollama says no"}, ClientError(404, None, "ollama says no")),
    (404, {"detail": "no instance x"}, ClientError(404, None, "no instance x")),
    (422, {"detail": [{"loc": ["body", "minNodes"], "msg": "too small"}]},
     ClientError(422, "invalid_request", "minNodes: too small")),
])
def test_errors_decode_from_every_wire_shape(status, body, expected):
    assert error_from_response(status, json.dumps(body)) == expected


def test_a_non_json_error_keeps_its_text():
    assert error_from_response(502, "Bad Gateway\n") == ClientError(502, None, "Bad Gateway")


@pytest.mark.parametrize(("target", "expected"), [
    ("i3", ["i3"]),
    ("m/one", ["i1", "i2"]),
])
def test_unplace_takes_an_instance_or_every_instance_of_a_model(target, expected):
    assert unplace_targets(target, STATE) == expected


def test_unplace_of_nothing_is_an_error_naming_it():
    with pytest.raises(ClientError, match="'m/none'"):
        unplace_targets("m/none", STATE)


@pytest.mark.parametrize(("given", "expected"), [
    (["aaaa1111"], ["aaaa1111"]),
    (["beta"], ["bbbb2222"]),
    (["bbbb"], ["bbbb2222"]),
    ([], []),
])
def test_exclusions_resolve_ids_names_and_prefixes(given, expected):
    assert resolve_nodes(given, STATE) == expected


@pytest.mark.parametrize("given", [["gamma"], [""]])
def test_an_unknown_or_ambiguous_exclusion_is_an_error(given):
    with pytest.raises(ClientError) as error:
        resolve_nodes(given, STATE)
    assert "alpha (aaaa1111)" in error.value.message


def test_rows_name_nodes_roles_health_and_runner_states():
    cluster = {"masterNodeId": "aaaa1111", "nodes": [
        {"nodeId": "aaaa1111", "name": "alpha", "alive": True, "backends": ["llama_cpp"],
         "memory": {"total": 2 * 1024**3, "available": 1024**3}},
        {"nodeId": "bbbb2222", "name": "beta", "alive": False, "backends": [], "memory": {}},
    ]}
    alpha, beta = node_rows(cluster, STATE)
    assert alpha[:5] == ("alpha", "aaaa1111", "master", "yes", "ok")
    assert alpha[5] == "1.0 GiB / 2.0 GiB" and alpha[7] == "Ready, Pending"
    assert beta[2:5] == ("worker", "no", "error: heartbeat late")
    rows = instance_rows(STATE)
    assert [r[0] for r in rows] == ["i1", "i2", "i3"]
    assert rows[1][3:6] == ("beta", "Loading", "2048") and rows[2][4:6] == ("Pending", "-")


@pytest.mark.parametrize(("data", "expected"), [
    ("[DONE]", None),
    (json.dumps({"choices": [], "usage": {"completion_tokens": 3}}), None),
    (json.dumps({"choices": [{"delta": {"content": "hi"}, "finish_reason": None}]}), ChatDelta(content="hi")),
    (json.dumps({"choices": [{"delta": {"reasoning_content": "hmm"}, "finish_reason": None}]}),
     ChatDelta(reasoning="hmm")),
    (json.dumps({"choices": [{"delta": {}, "finish_reason": "length"}]}), ChatDelta(finish_reason="length")),
    (json.dumps({"error": {"message": "runner died", "type": "server_error", "code": "RunnerCrashed"}}),
     ChatDelta(error=ClientError(0, "RunnerCrashed", "runner died"))),
])
def test_chat_stream_chunks_become_deltas(data, expected):
    assert chat_delta(data) == expected


@pytest.mark.parametrize(("shard", "cell"), [
    ({"slots": 3}, "3"),
    ({"slots": 2, "slotsWanted": 8}, "2 (of 8)"),
    ({}, "1"),
])
def test_a_preview_row_shows_the_slots_granted(shard, cell):
    preview = {"shards": [{"nodeId": "aaaa1111", "rank": 0, "startLayer": 0, "endLayer": 6,
                           "backend": "llama_server-cpu", **shard}]}
    assert preview_rows(preview, STATE) == [("alpha", "0", "0-6", "llama_server-cpu", cell)]


def test_instance_problems_name_failed_runners_and_stopped_repairs():
    state = {**STATE, "runners": {"r1": {"state": "Failed", "gaveUp": True, "errorMessage": "keeps failing"},
                                  "r2": {"state": "Failed"}, "r3": {"state": "Ready"}},
             "repairFailures": {"m/one": {"instanceId": "i1", "repairHop": 1, "reason": "no other node admits it"}}}
    assert instance_problems(state) == [
        "m/one instance i1: runner on alpha Failed, not restarted: keeps failing",
        "m/one instance i2: runner on beta Failed: no reason given",
        "m/one: automatic repair stopped: no other node admits it",
    ]
    assert instance_problems(STATE) == []
