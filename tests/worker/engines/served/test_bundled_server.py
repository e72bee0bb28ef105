"""The bundled llama-server host: every flag the served engine writes is honoured, any other
is refused, and the settings land on xllamacpp's own parameters."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from skulk.worker.engines.served.bundled_server import (
    EXIT_USAGE,
    HostSettings,
    UnsupportedFlag,
    apply_settings,
    parse_server_argv,
)
from skulk.worker.engines.served.launch import ServerLaunch
from tests.llama_server_kit import require_bundled_server

LAUNCH = ServerLaunch(binary=Path("/x/skulk-llama-server"), model_path=Path("/m/model.gguf"), port=4321, slots=4,
                      context_per_slot=512, threads=2, gpu_layers=0, flash_attn=False, cache_ram_mib=64,
                      kv_cache_type="q8_0", spec_type="ngram-simple")


def test_the_served_engines_command_line_is_read_whole():
    assert parse_server_argv(LAUNCH.argv()[1:]) == HostSettings(
        model="/m/model.gguf", host="127.0.0.1", port=4321, parallel=4, ctx_size=2048, kv_unified=False,
        cont_batching=True, threads=2, gpu_layers=0, flash_attn="off", fit=False, jinja=True, webui=False,
        cache_ram_mib=64, cache_type_k="q8_0", cache_type_v="q8_0", spec_type="ngram-simple",
    )


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--model", "m", "--draft-model", "d"], "--draft-model is not a flag"),
        (["--model", "m", "--port", "eighty"], "whole number"),
        (["--model", "m", "--flash-attn", "maybe"], "on, off or auto"),
        (["--model", "m", "--fit", "sometimes"], "on or off"),
        (["--model", "m", "--cache-type-k", "iq4_nl"], "f16, q8_0, q4_0"),
        (["--model", "m", "--spec-type", "draft-eagle3"], "none, ngram-simple, draft-simple"),
        (["--model", "m", "--spec-type", "draft-simple"], "go together"),
        (["--model", "m", "--model-draft", "d"], "go together"),
        (["--model", "m", "--cache-type-k-draft", "q5_1"], "f16, q8_0, q4_0"),
        (["--model"], "needs a value"),
        (["--port", "1"], "--model is required"),
    ],
)
def test_a_flag_it_cannot_honour_is_refused_by_name(argv, says):
    with pytest.raises(UnsupportedFlag, match=says):
        parse_server_argv(argv)


def test_settings_land_on_xllamacpps_parameters():
    xllamacpp = pytest.importorskip("xllamacpp")
    params = xllamacpp.CommonParams()
    apply_settings(parse_server_argv(LAUNCH.argv()[1:]), params, xllamacpp.llama_flash_attn_type, xllamacpp.ggml_type,
                   xllamacpp.common_speculative_type)
    assert (params.model.path, params.hostnames, params.port, params.n_parallel, params.n_ctx) == (
        "/m/model.gguf", ["127.0.0.1"], 4321, 4, 2048)
    assert (params.kv_unified, params.cont_batching, params.fit_params, params.use_jinja, params.ui) == (
        False, True, False, True, False)
    assert (params.cpuparams.n_threads, params.cpuparams_batch.n_threads, params.n_gpu_layers) == (2, 2, 0)
    assert params.flash_attn_type == xllamacpp.llama_flash_attn_type.LLAMA_FLASH_ATTN_TYPE_DISABLED
    assert params.cache_ram_mib == 64
    assert params.cache_type_k == params.cache_type_v == xllamacpp.ggml_type.GGML_TYPE_Q8_0
    assert params.speculative.types == [xllamacpp.common_speculative_type.COMMON_SPECULATIVE_TYPE_NGRAM_SIMPLE]


DRAFTING = ServerLaunch(binary=Path("/x/skulk-llama-server"), model_path=Path("/m/model.gguf"), port=4321, slots=1,
                        context_per_slot=512, threads=3, gpu_layers=99, flash_attn=True, kv_cache_type="q4_0",
                        spec_type="draft-simple", draft_model_path=Path("/m/draft.gguf"))


def test_a_draft_model_lands_on_xllamacpps_draft_parameters():
    xllamacpp = pytest.importorskip("xllamacpp")
    settings = parse_server_argv(DRAFTING.argv()[1:])
    assert (settings.spec_type, settings.model_draft, settings.threads_draft, settings.gpu_layers_draft,
            settings.cache_type_k_draft, settings.cache_type_v_draft) == (
        "draft-simple", "/m/draft.gguf", 3, 99, "q4_0", "q4_0")
    params = xllamacpp.CommonParams()
    apply_settings(settings, params, xllamacpp.llama_flash_attn_type, xllamacpp.ggml_type,
                   xllamacpp.common_speculative_type)
    draft = params.speculative.draft
    assert params.speculative.types == [xllamacpp.common_speculative_type.COMMON_SPECULATIVE_TYPE_DRAFT_SIMPLE]
    assert (draft.mparams.path, draft.cpuparams.n_threads, draft.cpuparams_batch.n_threads, draft.n_gpu_layers) == (
        "/m/draft.gguf", 3, 3, 99)
    assert draft.cache_type_k == draft.cache_type_v == xllamacpp.ggml_type.GGML_TYPE_Q4_0


def test_the_script_refuses_an_unknown_flag_with_a_usage_exit():
    script = require_bundled_server()
    done = subprocess.run([str(script), "--model", "m", "--spec-ngram"], capture_output=True, text=True, timeout=60)
    assert done.returncode == EXIT_USAGE and "--spec-ngram is not a flag" in done.stderr


def test_a_model_it_cannot_read_fails_the_start_loudly(tmp_path):
    script = require_bundled_server()
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"not a gguf")
    done = subprocess.run([str(script), "--model", str(broken), "--port", "0"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "cannot serve" in done.stderr


def test_a_projector_lands_on_xllamacpps_mmproj_path():
    xllamacpp = pytest.importorskip("xllamacpp")
    seeing = ServerLaunch(binary=Path("/x/skulk-llama-server"), model_path=Path("/m/model.gguf"), port=4321, slots=1,
                          context_per_slot=512, threads=1, gpu_layers=0, flash_attn=False,
                          projector_path=Path("/m/mmproj.gguf"))
    settings = parse_server_argv(seeing.argv()[1:])
    assert settings.mmproj == "/m/mmproj.gguf"
    params = xllamacpp.CommonParams()
    apply_settings(settings, params, xllamacpp.llama_flash_attn_type, xllamacpp.ggml_type,
                   xllamacpp.common_speculative_type)
    assert params.mmproj.path == "/m/mmproj.gguf"
