"""ctypes binding to the ggml RPC backend inside llama-cpp-python's own libraries (built
with GGML_RPC=on), so a node needs no separate binary to pool.

Registering an RPC server is not enough for llama.cpp to use it (tried: every layer stayed
on the local CPU): llama-cpp-python never fills `llama_model_params.devices`, and this
build's default device selection does not pick the registered RPC devices up. So the driver
passes the device list explicitly, as llama.cpp's own `--rpc` / `--device` handling does
(`model_devices`).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import socket
import threading
import time
from collections.abc import Iterator, Sequence
from functools import cache
from typing import Any

GGML_DEVICE_TYPE_CPU = 0
GGML_DEVICE_TYPE_GPU = 1
GGML_DEVICE_TYPE_IGPU = 2
SERVER_READY_TIMEOUT_S = 10.0


class RpcUnavailable(Exception):
    """This llama.cpp build has no RPC backend (llama-cpp-python built without GGML_RPC)."""


@cache
def _libs() -> tuple[Any, Any]:
    import llama_cpp

    libdir = os.path.join(os.path.dirname(llama_cpp.__file__), "lib")
    try:
        ggml = ctypes.CDLL(os.path.join(libdir, "libggml.so"))
        rpc = ctypes.CDLL(os.path.join(libdir, "libggml-rpc.so"))
    except OSError as exc:
        raise RpcUnavailable(f"llama-cpp-python has no ggml RPC backend ({exc}); rebuild it with -DGGML_RPC=on") from exc
    ggml.ggml_backend_dev_by_type.restype = ctypes.c_void_p
    ggml.ggml_backend_dev_by_type.argtypes = [ctypes.c_int]
    ggml.ggml_backend_register.argtypes = [ctypes.c_void_p]
    ggml.ggml_backend_reg_dev_count.restype = ctypes.c_size_t
    ggml.ggml_backend_reg_dev_count.argtypes = [ctypes.c_void_p]
    ggml.ggml_backend_reg_dev_get.restype = ctypes.c_void_p
    ggml.ggml_backend_reg_dev_get.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    ggml.ggml_backend_dev_count.restype = ctypes.c_size_t
    ggml.ggml_backend_dev_get.restype = ctypes.c_void_p
    ggml.ggml_backend_dev_get.argtypes = [ctypes.c_size_t]
    ggml.ggml_backend_dev_type.restype = ctypes.c_int
    ggml.ggml_backend_dev_type.argtypes = [ctypes.c_void_p]
    rpc.ggml_backend_rpc_add_server.restype = ctypes.c_void_p
    rpc.ggml_backend_rpc_add_server.argtypes = [ctypes.c_char_p]
    rpc.ggml_backend_rpc_start_server.restype = None
    rpc.ggml_backend_rpc_start_server.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_size_t,
                                                  ctypes.c_void_p]
    return ggml, rpc


def free_loopback_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_listening(port: int, deadline_s: float) -> bool:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
        time.sleep(0.05)
    return False


def start_server(n_threads: int, cache_dir: str | None = None) -> int:
    """Start a ggml RPC server on 127.0.0.1 (never another address) serving this process's
    CPU device, on a daemon thread (the C call never returns; the server ends with the
    process). Returns its port once it accepts connections. `cache_dir`: llama.cpp's RPC
    tensor cache (weight tensors over 10 MiB are kept there by content hash, so a later load
    of the same tensors sends only their hashes)."""
    ggml, rpc = _libs()
    cpu = ggml.ggml_backend_dev_by_type(GGML_DEVICE_TYPE_CPU)
    devices = (ctypes.c_void_p * 1)(cpu)
    for _attempt in range(3):
        port = free_loopback_port()
        endpoint = f"127.0.0.1:{port}".encode()
        cache = cache_dir.encode() if cache_dir else None
        thread = threading.Thread(
            target=rpc.ggml_backend_rpc_start_server, args=(endpoint, cache, n_threads, 1, devices),
            name="ggml-rpc-server", daemon=True,
        )
        thread.start()
        if _wait_listening(port, SERVER_READY_TIMEOUT_S):
            return port
    raise RpcUnavailable("the ggml RPC server did not start listening on loopback")


def add_servers(endpoints: Sequence[str]) -> list[int]:
    """Register one RPC server per endpoint; their device handles, in order."""
    ggml, rpc = _libs()
    devices: list[int] = []
    for endpoint in endpoints:
        reg = rpc.ggml_backend_rpc_add_server(endpoint.encode())
        if not reg:
            raise RpcUnavailable(f"ggml could not add the RPC server {endpoint}")
        ggml.ggml_backend_register(reg)
        count = ggml.ggml_backend_reg_dev_count(reg)
        if count < 1:
            raise RpcUnavailable(f"the RPC server {endpoint} offers no device")
        device = ggml.ggml_backend_reg_dev_get(reg, 0)
        _rpc_devices.add(device)
        devices.append(device)
    return devices


def local_accelerators() -> list[int]:
    """This process's own GPU devices (none on a CPU build)."""
    ggml, _ = _libs()
    out = []
    for i in range(ggml.ggml_backend_dev_count()):
        dev = ggml.ggml_backend_dev_get(i)
        if ggml.ggml_backend_dev_type(dev) in (GGML_DEVICE_TYPE_GPU, GGML_DEVICE_TYPE_IGPU) and dev not in _rpc_devices:
            out.append(dev)
    return out


_rpc_devices: set[int] = set()


class DevicesNotApplied(RpcUnavailable):
    """llama-cpp-python built the model without asking for its default parameters on the
    loading thread, so the pool's device list could not be applied: loading anyway would
    silently keep every layer local."""


_placement_lock = threading.Lock()
_kept_device_lists: list[Any] = []
"""Every device list handed to llama.cpp, kept for the process's life: llama-cpp-python keeps
the params (and so the pointer) on its Llama object after the load."""


@contextlib.contextmanager
def model_devices(devices: Sequence[int]) -> Iterator[None]:
    """Within the block, a llama_cpp.Llama constructed *on this thread* loads onto `devices`
    (NULL-terminated list in llama_model_params.devices).

    llama-cpp-python exposes no argument for the device list, so its default-params factory
    (`llama_cpp.llama_model_default_params`, looked up through the module when a Llama is
    built) is wrapped for the block. What makes that safe:
    - one block at a time (a lock), and the wrapper applies the list only on the thread that
      opened the block: another thread building a model meanwhile gets plain defaults;
    - the list is kept alive for the process (llama-cpp-python keeps the pointer);
    - the block fails with `DevicesNotApplied` when no params were built through the wrapper
      on this thread (a llama-cpp-python that stopped building them that way), instead of a
      model silently loaded with every layer local;
    - the original factory is restored on the way out, whatever happened."""
    import llama_cpp.llama_cpp as bindings  # the module `llama_cpp.llama` builds its Llama through

    array = (ctypes.c_void_p * (len(devices) + 1))(*devices, None)
    owner = threading.get_ident()
    applied: list[int] = []
    with _placement_lock:
        original = bindings.llama_model_default_params

        def with_devices() -> Any:
            params: Any = original()
            if threading.get_ident() == owner:
                params.devices = ctypes.cast(array, ctypes.c_void_p)
                applied.append(1)
            return params

        _kept_device_lists.append(array)
        bindings.llama_model_default_params = with_devices
        try:
            yield
        finally:
            bindings.llama_model_default_params = original
        if not applied:
            raise DevicesNotApplied(
                "llama-cpp-python did not build its model parameters through llama_model_default_params on the "
                "loading thread, so the pool's device list was not applied (every layer would stay local)")


__all__ = ["DevicesNotApplied", "RpcUnavailable", "add_servers", "free_loopback_port", "local_accelerators", "model_devices", "start_server"]
