# Type stub for the parts of msgpack (1.x) Skulk uses: msgpack ships no annotations, so
# without this every packb/unpackb result is Unknown (or "bytes | None" from its source).
# Keep it to the names src/ uses; add a name here when src/ starts using it.
from collections.abc import Callable
from typing import Any

class UnpackException(Exception): ...
class PackException(Exception): ...

def packb(
    o: Any,
    *,
    default: Callable[[Any], Any] | None = ...,
    use_single_float: bool = ...,
    use_bin_type: bool = ...,
    strict_types: bool = ...,
    datetime: bool = ...,
    unicode_errors: str | None = ...,
) -> bytes: ...
def unpackb(
    packed: bytes | bytearray | memoryview,
    *,
    raw: bool = ...,
    use_list: bool = ...,
    strict_map_key: bool = ...,
    object_hook: Callable[[dict[Any, Any]], Any] | None = ...,
    timestamp: int = ...,
    unicode_errors: str | None = ...,
    max_buffer_size: int = ...,
    max_str_len: int = ...,
    max_bin_len: int = ...,
    max_array_len: int = ...,
    max_map_len: int = ...,
    max_ext_len: int = ...,
) -> Any: ...

class Packer:
    def __init__(
        self,
        *,
        default: Callable[[Any], Any] | None = ...,
        use_single_float: bool = ...,
        autoreset: bool = ...,
        use_bin_type: bool = ...,
        strict_types: bool = ...,
        datetime: bool = ...,
        unicode_errors: str | None = ...,
    ) -> None: ...
    def pack(self, obj: Any) -> bytes: ...
