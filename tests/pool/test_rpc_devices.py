"""`rpc.model_devices`: how the pool's device list reaches llama.cpp through
llama-cpp-python's default-params factory, with the real bindings (no model is loaded; the
device handles are never dereferenced)."""

from __future__ import annotations

import ctypes
import threading

import llama_cpp
import llama_cpp.llama as llama_module
import pytest

from skulk.pool import rpc

DEVICES = [0x1000, 0x2000]


def _device_list(params) -> list[int]:
    """The NULL-terminated device list in `params`, as integers ([] for NULL)."""
    if not params.devices:
        return []
    array = ctypes.cast(params.devices, ctypes.POINTER(ctypes.c_void_p))
    out = []
    while array[len(out)]:
        out.append(array[len(out)])
    return out


def _params_as_llama_builds_them():
    return llama_module.llama_cpp.llama_model_default_params()  # what Llama.__init__ calls


def test_the_loading_thread_gets_the_devices_and_another_thread_does_not():
    original = llama_module.llama_cpp.llama_model_default_params
    other: list = []
    with rpc.model_devices(DEVICES):
        mine = _params_as_llama_builds_them()
        thread = threading.Thread(target=lambda: other.append(_params_as_llama_builds_them()))
        thread.start()
        thread.join(timeout=30)
    assert _device_list(mine) == DEVICES
    assert _device_list(other[0]) == []
    assert llama_module.llama_cpp.llama_model_default_params is original
    assert _device_list(llama_cpp.llama_model_default_params()) == []


def test_a_block_that_built_no_params_refuses_instead_of_loading_everything_locally():
    original = llama_module.llama_cpp.llama_model_default_params
    with pytest.raises(rpc.DevicesNotApplied, match="every layer would stay local"), rpc.model_devices(DEVICES):
        pass  # as a llama-cpp-python that no longer builds its params through the factory
    assert llama_module.llama_cpp.llama_model_default_params is original


def test_a_failed_load_restores_the_factory_and_keeps_its_own_error():
    original = llama_module.llama_cpp.llama_model_default_params
    with pytest.raises(ValueError, match="bad gguf"), rpc.model_devices(DEVICES):
        _params_as_llama_builds_them()
        raise ValueError("bad gguf")
    assert llama_module.llama_cpp.llama_model_default_params is original


def test_the_device_list_outlives_the_block():
    """llama-cpp-python keeps the params (and the pointer) on its Llama after the load."""
    with rpc.model_devices(DEVICES):
        params = _params_as_llama_builds_them()
    import gc

    gc.collect()
    assert _device_list(params) == DEVICES


def test_the_driver_reports_an_unapplied_device_list_as_a_load_failure():
    from skulk.worker.engines.base import ModelLoadFailed
    from skulk.worker.engines.llama_cpp.pool import _placed_on

    with pytest.raises(ModelLoadFailed, match=r"pool driver: .*device list was not applied"), _placed_on(DEVICES):
        pass
