"""Which multimodal projector (mmproj GGUF) a llama.cpp engine loads for a card that sees.

Both llama.cpp engines read the projector from `ShardSpec.projector_path` (resolved by the
worker, `skulk.models.companions.projector_path`): llama-server passes it as `--mmproj`, the
in-process engine opens it with mtmd (`llama_cpp.vision`). A vision card whose projector is
not on the node is refused at load by both, by name: it is never served blind. Pure apart
from one `is_file` check; it never downloads anything.
"""

from __future__ import annotations

from pathlib import Path

from skulk.worker.engines.base import ModelLoadFailed, ShardSpec


class ProjectorMissing(ModelLoadFailed):
    """A vision card whose projector (mmproj) is not on this node."""


def projector_launch_path(spec: ShardSpec) -> Path | None:
    """The projector the engine loads for a card that sees images, or None. A vision card
    without its projector on this node is refused at load: it must not be served blind."""
    if "vision" not in spec.card.capabilities:
        return None
    if spec.projector_path is None or not Path(spec.projector_path).is_file():
        source = spec.card.vision_weights_repo or "the generated mmproj beside the model"
        raise ProjectorMissing(f"{spec.card.model_id} sees images through its projector ({source}), "
                               f"which is not on this node ({spec.projector_path or 'not resolved'})")
    return Path(spec.projector_path)


__all__ = ["ProjectorMissing", "projector_launch_path"]
