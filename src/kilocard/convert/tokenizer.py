"""The Hugging Face tokenizer of a conversion: kept beside an import, written beside an export.

``hf-to-mcore`` copies the tokenizer files of the model folder (``TOKENIZER_FILES``, those present) into
``OUT/tokenizer/``: the import keeps the tokenizer its weights were trained with, even after the download is
deleted. ``mcore-to-hf`` writes a tokenizer beside the exported weights, so that
``AutoTokenizer.from_pretrained(OUT)`` loads it, as Megatron-Bridge's export does. Which one, the first found:

1. the run's ``data.tokenizer`` (the frozen config of the run whose ``checkpoints/`` holds the step) when it
   is a Hugging Face ``tokenizer.json``: what the weights were trained on last;
2. the tokenizer an import kept beside the step's checkpoint directory (an export of an import);
3. the tokenizer kept beside the run's ``checkpoint.load`` (a run started from an import, on
   ``kilocard-bytes`` or mock data).

Otherwise nothing is written and the verb says so in its line: ``kilocard-bytes`` and SentencePiece or
tiktoken files are not Hugging Face tokenizers. Every file is read through the safe reader.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from kilocard.base.safe_read import FileReadError, is_regular, read_bytes, read_json
from kilocard.convert.maps import ConvertUsageError
from kilocard.data.chat import NAMED_TEMPLATES, named_template_files
from kilocard.data.errors import DataError
from kilocard.data.record import HF_FILE, tokenizer_file
from kilocard.data.tokenizer import HF, tokenizer_type
from kilocard.rundir.freeze import HASH_FILE, FrozenConfigError, load_verified
from kilocard.rundir.names import CHECKPOINTS_DIR

TOKENIZER_DIR = "tokenizer"
"""The folder beside an imported checkpoint's steps that holds its Hugging Face tokenizer."""
TOKENIZER_FILES = (
    HF_FILE,
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template.jinja",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
)
"""The files of a Hugging Face tokenizer (``save_pretrained``'s names); each is copied when present, and so are the
named chat templates (``tokenizer_names``)."""


def tokenizer_names(folder: Path) -> tuple[str, ...]:
    """``TOKENIZER_FILES`` and the named chat templates of ``folder`` (``additional_chat_templates/NAME.jinja``,
    which transformers loads beside ``chat_template.jinja``)."""
    templates = [] if (folder / NAMED_TEMPLATES).is_symlink() else named_template_files(folder)
    return TOKENIZER_FILES + tuple(f"{NAMED_TEMPLATES}/{p.name}" for p in templates)


def copy_files(src: Path, dst: Path, names: tuple[str, ...] | None = None) -> list[str]:
    """Copy the files ``names`` (default: ``tokenizer_names(src)``) present in folder ``src`` into ``dst``
    (created); the names copied."""
    copied = []
    for name in tokenizer_names(src) if names is None else names:
        if not os.path.lexists(src / name):
            continue  # absent; anything else present is read through the safe reader, or refused in one line
        try:
            data = read_bytes(src / name)
        except FileReadError as e:
            raise ConvertUsageError(f"tokenizer: {e}") from None
        (dst / name).parent.mkdir(parents=True, exist_ok=True)
        (dst / name).write_bytes(data)
        copied.append(name)
    return copied


def keep_import_tokenizer(hf_dir: Path, out: Path) -> bool:
    """``hf-to-mcore``: the model folder's tokenizer files (and its ``generation_config.json``, the sampling
    defaults an export writes out again) into ``out/tokenizer/``; whether there were tokenizer files."""
    kept = bool(copy_files(hf_dir, out / TOKENIZER_DIR))
    if kept:
        copy_files(hf_dir, out / TOKENIZER_DIR, (GENERATION_CONFIG,))
    return kept


GENERATION_CONFIG = "generation_config.json"
"""What ``GenerationConfig.from_pretrained`` (and ``model.generate``) reads beside a Hugging Face model."""


def write_generation_config(source: Path | None, out: Path) -> None:
    """``generation_config.json`` beside exported weights: the source model's own when the tokenizer folder
    ``source`` kept one (its sampling defaults), else what transformers derives for a config without one
    (``GenerationConfig.from_model_config``: ``_from_model_config`` and the tokenizer's BOS/EOS token ids
    where ``tokenizer_config.json`` names them)."""
    if source is not None and copy_files(source, out, (GENERATION_CONFIG,)):
        return
    config: dict[str, Any] = {"_from_model_config": True, **(_special_ids(source) if source is not None else {})}
    (out / GENERATION_CONFIG).write_text(json.dumps(config, indent=2) + "\n")


def _special_ids(source: Path) -> dict[str, int]:
    """``bos_token_id`` and ``eos_token_id`` of the tokenizer in ``source``: the tokens ``tokenizer_config.json``
    names, by their id in its ``added_tokens_decoder`` or in ``tokenizer.json``'s ``added_tokens``."""
    cfg = _json_or_empty(source / "tokenizer_config.json")
    ids: dict[str, int] = {}
    decoder = cfg.get("added_tokens_decoder")
    for k, v in (decoder if isinstance(decoder, dict) else {}).items():
        if isinstance(v, dict) and str(k).isdigit():
            ids[str(v.get("content"))] = int(k)
    added = _json_or_empty(source / HF_FILE).get("added_tokens")
    for t in added if isinstance(added, list) else []:
        if isinstance(t, dict) and isinstance(t.get("id"), int):
            ids.setdefault(str(t.get("content")), t["id"])
    out = {}
    for role in ("bos", "eos"):
        token = cfg.get(f"{role}_token")
        token = token.get("content") if isinstance(token, dict) else token
        if isinstance(token, str) and token in ids:
            out[f"{role}_token_id"] = ids[token]
    return out


def _json_or_empty(path: Path) -> dict[str, Any]:
    """A JSON object file through the safe reader; empty when absent or not one (the ids are then left out)."""
    if not is_regular(path):
        return {}
    try:
        return read_json(path, dict)
    except FileReadError:
        return {}


def _hf_folder_of(name: str | None) -> Path | None:
    """The folder of ``data.tokenizer`` ``name`` when it is a Hugging Face ``tokenizer.json`` in one."""
    try:
        path = tokenizer_file(name) if name else None
        if path is None or path.name != HF_FILE or tokenizer_type(path) != HF:
            return None
    except DataError:
        return None
    return path.parent


def _kept(root: Path | str | None) -> Path | None:
    """The tokenizer an import kept beside checkpoint directory ``root``."""
    folder = Path(root) / TOKENIZER_DIR if root else None
    return folder if folder is not None and is_regular(folder / HF_FILE) else None


def export_tokenizer_source(step_dir: Path) -> Path | None:
    """The folder whose tokenizer goes beside an export of ``step_dir`` (the module docstring's order)."""
    root = step_dir.parent
    run_dir = root.parent if root.name == CHECKPOINTS_DIR and (root.parent / HASH_FILE).is_file() else None
    cfg = None
    if run_dir is not None:
        try:
            cfg, _ = load_verified(run_dir)
        except FrozenConfigError as e:
            raise ConvertUsageError(f"{step_dir}: its run's frozen config cannot be used ({e})") from None
    candidates = [
        _hf_folder_of(cfg.data.tokenizer) if cfg else None,
        _kept(root),
        _kept(cfg.checkpoint.load) if cfg else None,
    ]
    return next((c for c in candidates if c is not None), None)
