"""A kit for the vision tests: small real images, a PNG header that declares a bomb, and an
in-process app serving a model whose card sees on an engine that serves images."""

from __future__ import annotations

import base64
import contextlib
import http.server
import io
import struct
import threading
import zlib
from collections.abc import Iterator

from PIL import Image

from skulk.models.cards import builtin_cards_dir, resolve_cards
from skulk.shared.types.ids import ModelId
from skulk.shared.types.instances import Instance, RunnerStatus, ShardAssignment
from skulk.shared.types.state import State
from tests.api.scripted_cluster import scripted_app

SEEING = "local/tiny-llama-gguf"
"""A GGUF card made to see (capability "vision") and placed on llama_server."""
BLIND = "local/tiny-llama"
"""The same placement's blind twin: a card without "vision" (text only), on llama_server."""
MLX_SEEING = "mlx-community/Llama-3.2-1B-Instruct-4bit"
"""A card made to see, placed on MLX, of a family MLX's vision path does not serve (llama;
its served families, LLaVA and Gemma 3, are `MLX_VLM_VISION_TYPES`): no engine of it sees."""

_BUILTIN = resolve_cards(builtin_cards_dir(), None).cards


def _seeing(model_id: str):
    card = _BUILTIN[ModelId(model_id)]
    return card if "vision" in card.capabilities else card.model_copy(update={"capabilities": (*card.capabilities, "vision")})


CARDS = {ModelId(SEEING): _seeing(SEEING), ModelId(BLIND): _BUILTIN[ModelId(BLIND)],
         ModelId(MLX_SEEING): _seeing(MLX_SEEING)}


def _instance(number: int, model_id: str, backend: str) -> Instance:
    return Instance(instance_id=f"i{number}", model_id=model_id, sharding="Pipeline",
                    shards=[ShardAssignment(node_id="n1", runner_id=f"r{number}", rank=0, world_size=1, start_layer=0,
                                            end_layer=6, backend=backend)],
                    context_token_limit=8192)


STATE = State(
    instances={"i1": _instance(1, SEEING, "llama_server-cpu"), "i2": _instance(2, BLIND, "llama_server-cpu"),
               "i3": _instance(3, MLX_SEEING, "mlx-cpu")},
    runners={"r1": RunnerStatus(state="Ready"), "r2": RunnerStatus(state="Ready"), "r3": RunnerStatus(state="Ready")},
)


def vision_app(texts=("I", " see"), **kwargs):
    return scripted_app(texts, state=STATE, context_fields={"get_cards": lambda: CARDS}, **kwargs)


def image_bytes(kind: str = "PNG", size: tuple[int, int] = (3, 2), color=(200, 30, 30)) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", size, color).save(out, format=kind)
    return out.getvalue()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def data_url(data: bytes, media_type: str = "image/png") -> str:
    return f"data:{media_type};base64,{b64(data)}"


def png_header(width: int, height: int) -> bytes:
    """A PNG whose IHDR declares `width` x `height` and whose data is one tiny (wrong) IDAT:
    decoding it would allocate width*height pixels; reading its header costs nothing."""
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 16)) + chunk(b"IEND", b"")


@contextlib.contextmanager
def loopback_server(release: threading.Event | None = None) -> Iterator[str]:
    """An HTTP server on 127.0.0.1 serving `image_bytes()` at /cat.png; with `release`, every answer
    waits for it (a stalled server)."""
    body = image_bytes()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if release is not None:
                release.wait(30)
            self.send_response(200)
            self.send_header("content-type", "image/png")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/cat.png"
    finally:
        if release is not None:
            release.set()
        server.shutdown()
        server.server_close()
        thread.join(10)
