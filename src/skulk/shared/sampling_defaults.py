"""What a request means when it leaves a sampling knob unset: llama.cpp's own defaults, which
the MLX engine follows too, so a request means the same thing whichever engine serves it.
The API echoes them where a wire format reports the values used (the Responses object's
`temperature` and `top_p` are numbers, never null)."""

from __future__ import annotations

DEFAULT_TEMPERATURE = 0.8
DEFAULT_TOP_P = 0.95
DEFAULT_TOP_K = 40
LLAMA_CPP_DEFAULT_MIN_P = 0.05
"""llama.cpp's min_p; MLX's is 0 (`skulk.worker.engines.mlx.sampling`)."""

__all__ = ["DEFAULT_TEMPERATURE", "DEFAULT_TOP_K", "DEFAULT_TOP_P", "LLAMA_CPP_DEFAULT_MIN_P"]
