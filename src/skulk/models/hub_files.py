"""Which files of a Hugging Face repository make up a model card's artifact.

A repository holds far more than an engine loads: README, images, PyTorch weights beside
the safetensors, a dozen GGUF quants of which a card means exactly one. Downloading the
wrong set either wastes disk (every quant) or leaves a model that cannot load (a GGUF shard
group missing its second part). This module is the one place that decides the set, as pure
functions over a repository listing, so every rule is a table-driven test:

- safetensors (MLX) repos: config, tokenizer and generation files at the top level, every
  `*.safetensors` weight file and its index. A repo without config.json or weights is not a
  model mlx-lm can load, and selecting nothing would "succeed" with an empty directory.
- CTranslate2 repos (faster-whisper): the model directory's top-level files, `model.bin`
  with its config, vocabulary, tokenizer and feature-extractor config.
- GGUF repos: one quant, chosen by a card's pinned `gguf_file` (the first shard of a split
  file) or, when a card is being built, by a quant preference order; split files
  (`name-00001-of-00003.gguf`) always come as their complete shard group.
- ONNX voices (Piper): the card's pinned `onnx_file` and its config beside it
  (`<file>.json`); a repo like rhasspy/piper-voices holds hundreds of voices, so nothing
  else of it is taken, and a voice without its config is not one Piper can load.

It must never do I/O: callers pass the listing (`RepoFile`s) they got from the hub or disk.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath

from skulk.shared.types.engines import ArtifactFormat

CONFIG_FILE = "config.json"
SAFETENSORS_INDEX_FILE = "model.safetensors.index.json"

SAFETENSORS_SIDE_FILES: frozenset[str] = frozenset(
    {
        CONFIG_FILE,
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "tokenizer.model",
        "special_tokens_map.json",
        "added_tokens.json",
        "vocab.json",
        "merges.txt",
        "chat_template.json",
        "chat_template.jinja",
        "preprocessor_config.json",
        "processor_config.json",
    }
)
"""Small top-level files mlx-lm (and its tokenizer loader) may read besides the weights."""

GGUF_QUANT_PREFERENCE: tuple[str, ...] = (
    "Q4_K_M", "Q4_K_S", "Q4_0", "Q5_K_M", "Q5_K_S", "Q5_0", "Q6_K", "Q8_0",
    "IQ4_XS", "IQ4_NL", "Q3_K_L", "Q3_K_M", "Q3_K_S", "Q2_K", "BF16", "F16", "F32",
)
"""Quants tried in order when a card is built from a GGUF repo: Q4_K_M first (the common
quality/size balance), then nearby sizes, full precision last (large, rarely wanted)."""

_SHARD_RE = re.compile(r"^(?P<stem>.+)-(?P<index>\d{5})-of-(?P<count>\d{5})\.gguf$", re.IGNORECASE)
_QUANT_RE = re.compile(
    r"(?<![A-Za-z0-9])(?P<quant>(?:I?Q\d(?:_[A-Z0-9]+)*)|BF16|F16|F32|FP16|FP32)(?![A-Za-z0-9])", re.IGNORECASE
)


@dataclass(frozen=True)
class RepoFile:
    """One file of a repository listing: repo-relative POSIX path and size (None = unknown)."""

    path: str
    size_bytes: int | None = None


class SelectionError(Exception):
    """The repository does not contain what the card needs: which repo, and why."""

    def __init__(self, repo_id: str, reason: str) -> None:
        self.repo_id = repo_id
        self.reason = reason
        super().__init__(repo_id, reason)

    def __str__(self) -> str:
        return f"{self.repo_id}: {self.reason}"


# ---------------------------------------------------------------------------------------
# Small predicates
# ---------------------------------------------------------------------------------------


def is_gguf(path: str) -> bool:
    return path.lower().endswith(".gguf")


def is_gguf_repo(files: Iterable[RepoFile]) -> bool:
    """A repo with any .gguf file is a GGUF repo (mlx-lm cannot load it; llama.cpp can)."""
    return any(is_gguf(f.path) for f in files)


def shard_info(path: str) -> tuple[str, int, int] | None:
    """'dir/m-Q4-00002-of-00003.gguf' -> ('dir/m-Q4', 2, 3); None for an unsplit file."""
    match = _SHARD_RE.match(path)
    if match is None:
        return None
    return match["stem"], int(match["index"]), int(match["count"])


def quant_of(path: str) -> str | None:
    """The quant label in a GGUF file name, upper-cased ('...-q4_k_m.gguf' -> 'Q4_K_M')."""
    name = PurePosixPath(path).name
    info = shard_info(name)
    stem = info[0] if info else name[: -len(".gguf")] if is_gguf(name) else name
    matches = list(_QUANT_RE.finditer(stem))
    if not matches:
        return None
    quant = matches[-1]["quant"].upper()
    return {"FP16": "F16", "FP32": "F32"}.get(quant, quant)


# ---------------------------------------------------------------------------------------
# GGUF selection
# ---------------------------------------------------------------------------------------


def shard_group(repo_id: str, files: Sequence[RepoFile], gguf_file: str) -> tuple[str, ...]:
    """`gguf_file` and, when it is a split file, every shard of its group in order. The named
    file must be present, and a split group must be complete: a partial group downloads fine
    and then fails to load, which is the failure this rule exists to prevent."""
    paths = {f.path for f in files}
    if gguf_file not in paths:
        raise SelectionError(repo_id, f"the repository has no file {gguf_file!r}")
    info = shard_info(gguf_file)
    if info is None:
        return (gguf_file,)
    stem, _index, count = info
    extension = gguf_file[-len(".gguf"):]  # keep the listing's own case
    group = tuple(f"{stem}-{i:05d}-of-{count:05d}{extension}" for i in range(1, count + 1))
    missing = [p for p in group if p not in paths]
    if missing:
        raise SelectionError(repo_id, f"the split GGUF {gguf_file!r} is incomplete: missing {missing}")
    return group


def gguf_candidates(files: Sequence[RepoFile]) -> tuple[str, ...]:
    """The repo's GGUF artifacts, one entry per artifact: an unsplit file or the first shard
    of a group. Multimodal projector files (mmproj) are companions, never the model."""
    out = []
    for f in files:
        if not is_gguf(f.path) or "mmproj" in PurePosixPath(f.path).name.lower():
            continue
        info = shard_info(f.path)
        if info is None or info[1] == 1:
            out.append(f.path)
    return tuple(sorted(out))


def choose_gguf_file(
    repo_id: str,
    files: Sequence[RepoFile],
    preference: Sequence[str] = GGUF_QUANT_PREFERENCE,
    pinned: str | None = None,
) -> str:
    """The GGUF file a new card should name: `pinned` when given (it must exist), else the
    first quant of `preference` present in the repo, else the repo's only artifact. Several
    artifacts and no preferred quant is an error naming them: guessing would pick a size
    the operator did not ask for."""
    if pinned is not None:
        shard_group(repo_id, files, pinned)  # exists, and its group is complete
        return pinned
    candidates = gguf_candidates(files)
    if not candidates:
        raise SelectionError(repo_id, "the repository holds no GGUF model file")
    by_quant: dict[str, list[str]] = {}
    for path in candidates:
        quant = quant_of(path)
        if quant is not None:
            by_quant.setdefault(quant, []).append(path)
    for quant in preference:
        if quant.upper() in by_quant:
            # Shortest path first: the top-level file over a same-quant copy in a subfolder.
            return min(by_quant[quant.upper()], key=lambda p: (p.count("/"), len(p), p))
    if len(candidates) == 1:
        return candidates[0]
    raise SelectionError(
        repo_id, f"no preferred quant ({', '.join(preference)}) among {list(candidates)}; pin one with gguf_file"
    )


# ---------------------------------------------------------------------------------------
# Safetensors selection
# ---------------------------------------------------------------------------------------


def select_safetensors(repo_id: str, files: Sequence[RepoFile]) -> tuple[str, ...]:
    """Top-level config, tokenizer and weight files of an MLX/transformers repo. Files in
    subfolders ('original/', 'onnx/') belong to other runtimes and are never selected."""
    top = [f.path for f in files if "/" not in f.path]
    if CONFIG_FILE not in top:
        raise SelectionError(repo_id, f"the repository has no top-level {CONFIG_FILE}: not a safetensors model")
    weights = [p for p in top if p.endswith(".safetensors")]
    if not weights:
        raise SelectionError(repo_id, "the repository has no top-level *.safetensors weights")
    chosen = [p for p in top if p in SAFETENSORS_SIDE_FILES or p == SAFETENSORS_INDEX_FILE] + weights
    return tuple(sorted(set(chosen)))


def select_onnx(repo_id: str, files: Sequence[RepoFile], onnx_file: str | None) -> tuple[str, ...]:
    """An ONNX voice: `onnx_file` and its `.onnx.json` config, both required."""
    if onnx_file is None:
        raise SelectionError(repo_id, "an ONNX card names its voice's file (onnx_file)")
    paths = {f.path for f in files}
    missing = [p for p in (onnx_file, f"{onnx_file}.json") if p not in paths]
    if missing:
        raise SelectionError(repo_id, f"the repository has no {' or '.join(map(repr, missing))} (a voice is its .onnx "
                             "and the .onnx.json beside it)")
    return (onnx_file, f"{onnx_file}.json")


# ---------------------------------------------------------------------------------------
# CTranslate2 selection
# ---------------------------------------------------------------------------------------

CTRANSLATE2_MODEL_FILE = "model.bin"
CTRANSLATE2_SIDE_FILES: frozenset[str] = frozenset({
    CONFIG_FILE, "tokenizer.json", "preprocessor_config.json", "vocabulary.json", "vocabulary.txt",
    "vocab.json", "merges.txt", "special_tokens_map.json", "tokenizer_config.json", "added_tokens.json",
    "normalizer.json", "generation_config.json",
})
"""Small top-level files CTranslate2 and faster-whisper read beside model.bin (the vocabulary
comes as vocabulary.json or .txt; tokenizer.json and preprocessor_config.json are
faster-whisper's)."""


def is_ctranslate2_repo(files: Iterable[RepoFile]) -> bool:
    """A repo with a top-level model.bin and config.json is a CTranslate2 model."""
    top = {f.path for f in files if "/" not in f.path}
    return CTRANSLATE2_MODEL_FILE in top and CONFIG_FILE in top


def select_ctranslate2(repo_id: str, files: Sequence[RepoFile]) -> tuple[str, ...]:
    """The top-level files of a CTranslate2 model directory (a faster-whisper repo):
    model.bin and its side files. Subfolders belong to other runtimes."""
    top = [f.path for f in files if "/" not in f.path]
    if CTRANSLATE2_MODEL_FILE not in top:
        raise SelectionError(repo_id, f"the repository has no top-level {CTRANSLATE2_MODEL_FILE}: not a "
                                      "CTranslate2 model")
    if not any(p.startswith("vocabulary.") for p in top):
        raise SelectionError(repo_id, "the repository has no top-level vocabulary.json or vocabulary.txt")
    return tuple(sorted(p for p in top if p == CTRANSLATE2_MODEL_FILE or p in CTRANSLATE2_SIDE_FILES))


# ---------------------------------------------------------------------------------------
# MLX Whisper selection
# ---------------------------------------------------------------------------------------

MLX_WHISPER_WEIGHT_FILES: tuple[str, ...] = ("weights.safetensors", "weights.npz")
"""The weight file mlx-whisper's `load_model` reads, in its order of preference."""


def is_mlx_whisper_repo(files: Iterable[RepoFile]) -> bool:
    """A repo with a top-level config.json and weights.safetensors or weights.npz (and no
    `model*.safetensors`) is an mlx-whisper model (the mlx-community `whisper-*-mlx` repos)."""
    top = {f.path for f in files if "/" not in f.path}
    return CONFIG_FILE in top and any(w in top for w in MLX_WHISPER_WEIGHT_FILES)


def select_mlx_whisper(repo_id: str, files: Sequence[RepoFile]) -> tuple[str, ...]:
    """config.json and the one weight file mlx-whisper loads (its tokenizer ships in its wheel)."""
    top = {f.path for f in files if "/" not in f.path}
    if CONFIG_FILE not in top:
        raise SelectionError(repo_id, f"the repository has no top-level {CONFIG_FILE}: not an mlx-whisper model")
    for weights in MLX_WHISPER_WEIGHT_FILES:
        if weights in top:
            return tuple(sorted((CONFIG_FILE, weights)))
    raise SelectionError(repo_id, f"the repository has no top-level {' or '.join(MLX_WHISPER_WEIGHT_FILES)}: not an "
                                  "mlx-whisper model")


# ---------------------------------------------------------------------------------------
# Entry point
# ---------------------------------------------------------------------------------------


def select_files(
    repo_id: str, artifact_format: ArtifactFormat, files: Sequence[RepoFile], gguf_file: str | None = None,
    *, onnx_file: str | None = None,
) -> tuple[str, ...]:
    """The repo-relative files to download for a card of `artifact_format`, sorted.

    GGUF cards always name their file (the card schema requires `gguf_file`); without one
    this applies the quant preference, as card building does. Hub ONNX cards name theirs
    (`onnx_file`)."""
    if artifact_format == "gguf":
        chosen = gguf_file if gguf_file is not None else choose_gguf_file(repo_id, files)
        return shard_group(repo_id, files, chosen)
    if artifact_format == "ctranslate2":
        return select_ctranslate2(repo_id, files)
    if artifact_format == "onnx":
        return select_onnx(repo_id, files, onnx_file)
    if artifact_format == "mlx_whisper":
        return select_mlx_whisper(repo_id, files)
    return select_safetensors(repo_id, files)


def total_size_bytes(files: Sequence[RepoFile], selected: Iterable[str]) -> int:
    """Bytes of the selected files (unknown sizes count as 0)."""
    sizes = {f.path: f.size_bytes or 0 for f in files}
    return sum(sizes.get(p, 0) for p in selected)


__all__ = [
    "CONFIG_FILE",
    "CTRANSLATE2_MODEL_FILE",
    "CTRANSLATE2_SIDE_FILES",
    "GGUF_QUANT_PREFERENCE",
    "MLX_WHISPER_WEIGHT_FILES",
    "SAFETENSORS_INDEX_FILE",
    "SAFETENSORS_SIDE_FILES",
    "ArtifactFormat",
    "RepoFile",
    "SelectionError",
    "choose_gguf_file",
    "gguf_candidates",
    "is_ctranslate2_repo",
    "is_gguf",
    "is_gguf_repo",
    "is_mlx_whisper_repo",
    "quant_of",
    "select_ctranslate2",
    "select_files",
    "select_mlx_whisper",
    "select_onnx",
    "select_safetensors",
    "shard_group",
    "shard_info",
    "total_size_bytes",
]
