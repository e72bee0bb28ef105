"""A model card built from a Hugging Face repo's own metadata (blocking hub reads).

The repo's listing says whether it is a GGUF repo (one quant file is chosen and its header
read, no more than `GGUF_HEADER_LIMIT_BYTES`), a CTranslate2 Whisper (its small files and a
few range reads of model.bin's variable records), a Piper voice repo (the chosen voice's
.onnx.json) or a safetensors repo (its config.json is read); `skulk.models.card_builder`
and `skulk.models.speech_cards` turn them into cards. `POST /models/add`, Ollama's
`/api/pull` of a name Skulk has no card for, and `skulk models pull` share it.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from skulk.models import hub_meta
from skulk.models.card_builder import (
    GGUF_HEADER_LIMIT_BYTES,
    CardBuildError,
    GgufHeader,
    GgufTruncated,
    card_from_config,
    card_from_gguf,
    parse_gguf_header,
    vision_projector,
)
from skulk.models.ctranslate2_header import Ct2FormatError, whisper_shape
from skulk.models.downloads import HubSource
from skulk.models.hub_files import (
    CONFIG_FILE,
    CTRANSLATE2_MODEL_FILE,
    GGUF_QUANT_PREFERENCE,
    choose_gguf_file,
    is_ctranslate2_repo,
    is_gguf_repo,
    is_mlx_whisper_repo,
    select_ctranslate2,
    select_safetensors,
    shard_group,
    total_size_bytes,
)
from skulk.models.hub_meta import RepoListing
from skulk.models.safetensors_header import MAX_HUB_WEIGHT_FILES, model_parameter_elements
from skulk.models.speech_cards import (
    WHISPER_VOCABULARY_FILES,
    card_from_piper,
    card_from_whisper,
    choose_piper_voice,
    is_piper_repo,
    missing_whisper_files,
    vocabulary_tokens,
)
from skulk.models.template_files import chat_template
from skulk.shared.types.cards import ModelCard

WHISPER_PREPROCESSOR_FILE = "preprocessor_config.json"


def read_gguf_header(read: Callable[[int], bytes], source: str) -> GgufHeader:
    """The GGUF header through `read(n)` (the first n bytes), reading more until it fits."""
    for size in hub_meta.growing_prefixes(GGUF_HEADER_LIMIT_BYTES):
        data = read(size)
        try:
            return parse_gguf_header(data, source)
        except GgufTruncated:
            if len(data) < size:  # the file itself ended: it is truncated, not our read
                raise CardBuildError(source, "the GGUF file ends inside its header") from None
    raise CardBuildError(source, f"the GGUF header is larger than {GGUF_HEADER_LIMIT_BYTES} bytes")


def card_from_hub(model_id: str, hub: HubSource, *, revision: str | None = None, gguf_file: str | None = None,
                  quant: str | None = None, name: str | None = None, onnx_file: str | None = None) -> ModelCard:
    """The card for `model_id` at `revision` (a branch or tag resolves to its commit, which
    the card pins). A GGUF repo's file: `gguf_file` when given, else the `quant` asked for,
    else the default quant preference. A Piper voice repo's voice: `onnx_file` when given,
    else its only voice. Raises hub_meta.HubError, CardBuildError or SelectionError."""
    listing = hub_meta.repo_listing(model_id, hub, revision)
    pin = listing.revision if revision else None
    files = list(listing.files)
    if is_gguf_repo(files):
        preference = (quant,) if quant else GGUF_QUANT_PREFERENCE
        chosen = choose_gguf_file(model_id, files, preference, pinned=gguf_file)
        group = shard_group(model_id, files, chosen)
        header = read_gguf_header(lambda n: hub_meta.read_prefix(model_id, chosen, listing.revision, hub, n),
                                  f"{model_id}/{chosen}")
        projector = vision_projector(files)
        projector_size = next((f.size_bytes for f in files if f.path == projector), None)
        return card_from_gguf(model_id, header.meta, chosen, total_size_bytes(files, group), revision=pin,
                              name=name, tensor_elements=header.tensor_elements, projector_file=projector,
                              projector_size_bytes=projector_size)
    if gguf_file is not None or quant is not None:
        raise CardBuildError(model_id, f"{'ggufFile' if gguf_file else f'quant {quant}'} given, but the repository "
                             "holds no GGUF files")
    if is_ctranslate2_repo(files) and onnx_file is None:
        return _whisper_card(model_id, listing, hub, pin, name)
    if is_mlx_whisper_repo(files):
        # Its config.json is Whisper's ModelDimensions, no HF config: a card built as a text
        # model's would be wrong, and the audio section is the writer's to state.
        raise CardBuildError(model_id, "an mlx-whisper repository: no card is built from it; write a card file for it "
                             "(docs/SPEECH.md, resources/model_cards/mlx-community--whisper-small-mlx.toml)")
    if onnx_file is not None or is_piper_repo(files):  # a named voice must be there, with its config
        voice = choose_piper_voice(model_id, files, onnx_file)
        config = hub_meta.read_json(model_id, f"{voice}.json", listing.revision, hub)
        return card_from_piper(model_id, voice, config, total_size_bytes(files, (voice, f"{voice}.json")),
                               revision=pin, name=name)
    selected = select_safetensors(model_id, files)
    config = hub_meta.read_json(model_id, CONFIG_FILE, listing.revision, hub)
    present = {f.path for f in files}

    def read(path: str) -> str | None:
        if path not in present:
            return None
        data = hub_meta.read_prefix(model_id, path, listing.revision, hub, hub_meta.CONFIG_LIMIT_BYTES)
        return data.decode("utf-8", errors="replace")

    def prefix_reader(path: str):
        return lambda size: hub_meta.read_prefix(model_id, path, listing.revision, hub, size)

    weights = [path for path in selected if path.endswith(".safetensors")]
    counted = len(weights) <= MAX_HUB_WEIGHT_FILES
    return card_from_config(model_id, config, total_size_bytes(files, selected), revision=pin, name=name,
                            chat_template=chat_template(read),
                            tensor_elements=model_parameter_elements(weights, prefix_reader, config) if counted else None)


def _whisper_card(model_id: str, listing: RepoListing, hub: HubSource, pin: str | None,
                  name: str | None) -> ModelCard:
    """A CTranslate2 Whisper's card: its shape from model.bin's variable records (a few
    range reads), its languages from config.json and the vocabulary, its sample rate from
    preprocessor_config.json (when shipped)."""
    files = list(listing.files)
    missing = missing_whisper_files(files)
    if missing:
        raise CardBuildError(model_id, f"a CTranslate2 Whisper repository needs {', '.join(missing)} at its top level "
                             "(faster-whisper loads them beside model.bin)")
    top = {f.path for f in files if "/" not in f.path}
    try:
        shape = whisper_shape(lambda offset, size: hub_meta.read_range(model_id, CTRANSLATE2_MODEL_FILE,
                                                                        listing.revision, hub, offset, size))
    except Ct2FormatError as exc:
        raise CardBuildError(model_id, f"model.bin: {exc}") from None
    config = hub_meta.read_json(model_id, CONFIG_FILE, listing.revision, hub)
    vocabulary = next(n for n in WHISPER_VOCABULARY_FILES if n in top)
    raw = hub_meta.read_prefix(model_id, vocabulary, listing.revision, hub, hub_meta.CONFIG_LIMIT_BYTES)
    try:
        tokens = vocabulary_tokens(vocabulary, json.loads(raw) if vocabulary.endswith(".json")
                                   else raw.decode("utf-8"))
    except ValueError as exc:
        raise CardBuildError(model_id, f"{vocabulary} cannot be read: {exc}") from None
    preprocessor = (hub_meta.read_json(model_id, WHISPER_PREPROCESSOR_FILE, listing.revision, hub)
                    if WHISPER_PREPROCESSOR_FILE in top else None)
    return card_from_whisper(model_id, shape, config, tokens, preprocessor,
                             total_size_bytes(files, select_ctranslate2(model_id, files)), revision=pin, name=name)


__all__ = ["card_from_hub", "read_gguf_header"]
