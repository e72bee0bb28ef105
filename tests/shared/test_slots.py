"""Served-engine slot settings and their KV arithmetic: pure tables."""

import pytest

from skulk.shared.slots import (
    DEFAULT_SLOTS,
    MAX_SLOTS,
    SlotSettingError,
    engine_slots,
    kv_copies,
    node_slot_settings,
    parse_slot_setting,
    slot_choices,
)


@pytest.mark.parametrize(("engine", "raw", "slots"), [
    ("llama_server", None, DEFAULT_SLOTS["llama_server"]),
    ("llama_server", "  ", DEFAULT_SLOTS["llama_server"]),
    ("llama_server", "8", 8),
    ("llama_server", " 1 ", 1),
    ("llama_server", "64", 64),
    ("vllm", None, DEFAULT_SLOTS["vllm"]),
    ("vllm", "256", 256),
])
def test_a_valid_setting_is_its_slot_count(engine, raw, slots):
    assert parse_slot_setting(engine, raw) == slots


@pytest.mark.parametrize(("engine", "raw", "says"), [
    ("llama_server", "0", "SKULK_LLAMA_SERVER_PARALLEL='0' is outside 1..64"),
    ("llama_server", "-1", "outside 1..64"),
    ("llama_server", "65", "outside 1..64"),
    ("llama_server", "four", "is not a whole number"),
    ("llama_server", "2.5", "is not a whole number"),
    ("vllm", "1000", "SKULK_VLLM_MAX_CONCURRENT_REQUESTS='1000' is outside 1..256"),
])
def test_an_invalid_setting_is_refused_never_clamped(engine, raw, says):
    error = parse_slot_setting(engine, raw)
    assert isinstance(error, SlotSettingError) and says in error.describe()


def test_node_settings_keep_the_valid_and_report_the_invalid():
    slots, errors = node_slot_settings({"SKULK_LLAMA_SERVER_PARALLEL": "x", "SKULK_VLLM_MAX_CONCURRENT_REQUESTS": "8"})
    assert slots == {"vllm": 8}
    assert [(e.engine, e.raw) for e in errors] == [("llama_server", "x")]
    assert node_slot_settings({}) == (dict(DEFAULT_SLOTS), [])


@pytest.mark.parametrize(("backend", "advertised", "slots"), [
    ("llama_server-cpu", {"llama_server": 8}, 8),
    ("llama_server-cuda", {}, DEFAULT_SLOTS["llama_server"]),  # a node that advertises none: the default
    ("vllm-cuda", {"vllm": 32, "llama_server": 2}, 32),
    ("llama_cpp-cpu", {"llama_server": 8}, 1),  # in-process engines decode one request at a time
    ("mlx-metal", {}, 1),
])
def test_engine_slots(backend, advertised, slots):
    assert engine_slots(backend, advertised) == slots


@pytest.mark.parametrize(("backend", "slots", "copies"), [
    ("llama_server-cpu", 4, 4),  # every slot owns a whole context of KV (--no-kv-unified)
    ("llama_server-cuda", 1, 1),
    ("vllm-cuda", 16, 1),  # one paged pool shared by every sequence
    ("llama_cpp-cpu", 1, 1),
])
def test_kv_copies(backend, slots, copies):
    assert kv_copies(backend, slots) == copies


@pytest.mark.parametrize(("card", "advertised", "choices"), [
    (["llama_server-cpu", "llama_cpp-cpu"], [["llama_cpp-cpu", "llama_server-cpu"]], {"llama_server": MAX_SLOTS["llama_server"]}),
    (["llama_server-cpu", "llama_cpp-cpu"], [["llama_cpp-cpu"]], {}),  # no node runs llama-server
    (["llama_cpp-cpu"], [["llama_cpp-cpu", "llama_server-cpu"]], {}),  # the card allows no engine with slots
    (["vllm-cuda", "llama_server-cuda"], [["mlx"], ["vllm-cuda"], ["llama_server-cuda"]],
     {"vllm": MAX_SLOTS["vllm"], "llama_server": MAX_SLOTS["llama_server"]}),
    (["mlx", "mlx-cpu"], [["mlx", "mlx-cpu"]], {}),
])
def test_slot_choices_are_the_cards_engines_with_slots_some_node_runs(card, advertised, choices):
    assert slot_choices(card, advertised) == choices
