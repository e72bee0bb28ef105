# The parts of xllamacpp (a Cython extension without type information) that Skulk uses:
# skulk.worker.engines.served.bundled_server drives llama.cpp's server through them.
from enum import IntEnum
from typing import Any

class llama_flash_attn_type(IntEnum):
    LLAMA_FLASH_ATTN_TYPE_AUTO = -1
    LLAMA_FLASH_ATTN_TYPE_DISABLED = 0
    LLAMA_FLASH_ATTN_TYPE_ENABLED = 1

class CommonParams:
    def __init__(self) -> None: ...
    def __getattr__(self, name: str) -> Any: ...
    def __setattr__(self, name: str, value: Any) -> None: ...

class Server:
    listening_address: str
    def __init__(self, params: CommonParams) -> None: ...

def get_device_info() -> list[dict[str, Any]]: ...
