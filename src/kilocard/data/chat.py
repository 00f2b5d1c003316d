"""Conversations -> token ids and an assistant-only loss mask, rendered with the tokenizer's own chat template.

``kilocard preprocess --chat`` reads JSONL lines of ``{"messages": [{"role", "content"}, ...]}`` or
``{"prompt", "completion"}`` (a user turn and an assistant turn). Each conversation is rendered
with the ``chat_template`` of the Hugging Face tokenizer folder (``tokenizer_config.json``, or a
``chat_template.jinja`` beside it) through transformers' ``apply_chat_template``, then tokenized
once as a whole, as a model sees it at inference.

Which tokens carry loss: the characters of assistant turn ``i`` are those the template adds between
``messages[:i]`` rendered with the generation prompt (the assistant header) and ``messages[:i + 1]``
rendered in full, so the assistant's content and the template's end-of-turn marker carry loss and
the headers, system and user turns do not. A token belongs to the turn its first character is in
(the tokenizer's offsets). A template that does not render a conversation as a growing prefix of its
turns cannot be split this way and is refused (one line).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any

import numpy

from kilocard.base.safe_read import FileReadError, read_json, read_text, require_regular, type_name
from kilocard.data.errors import DataError, require_utf8
from kilocard.data.record import HF_FILE, tokenizer_file

ROLES = ("system", "user", "assistant", "tool")
"""Roles a message may have."""
EXTRA = "pip install 'kilocard[chat]'"
"""How to install what rendering needs (transformers and jinja2)."""

Messages = list[dict[str, str]]


def tokenizer_folder(name: str) -> Path:
    """The Hugging Face tokenizer folder of ``--tokenizer`` (a folder, or the ``tokenizer.json`` in one), looked up
    as ``data.tokenizer`` is (the current directory, then kilocard's shipped root)."""
    try:
        found = tokenizer_file(name)
    except DataError as err:
        raise DataError(f"--tokenizer: {err}") from None
    if found is None or found.name != HF_FILE:
        raise DataError(
            f"--tokenizer: {name} is not a Hugging Face tokenizer folder (no {HF_FILE}); "
            f"fix: --chat needs the folder of a Hugging Face model ({HF_FILE} and tokenizer_config.json)"
        )
    for file in FOLDER_FILES:  # transformers skips what is not a file: a FIFO config would read as no template
        path = found.parent / file
        if path.is_symlink() or (path.exists() and not path.is_file()):
            try:
                require_regular(path)
            except FileReadError as err:
                raise DataError(f"--tokenizer: {err}; fix: a regular file, or none") from None
    return found.parent


FOLDER_FILES = ("tokenizer_config.json", "special_tokens_map.json", "added_tokens.json", "chat_template.jinja")
"""The files of a Hugging Face tokenizer folder besides ``tokenizer.json`` that transformers reads when present."""


def load_chat_tokenizer(name: str) -> Any:
    """transformers' tokenizer of folder ``name`` (offline), which must have a chat template.

    Loaded as transformers' generic fast tokenizer (``PreTrainedTokenizerFast``: the folder's
    ``tokenizer.json`` as written, with ``tokenizer_config.json``'s special tokens and template), the
    ``tokenizer.json`` that training's ``data.tokenizer`` reads too. ``AutoTokenizer`` would give the same
    ids and offsets for a rendered text, but it imports transformers' model configs and, through them,
    torch (with its optimizers): seconds that ``kilocard preprocess`` does not need.
    """
    folder = tokenizer_folder(name)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a local folder only: transformers never reaches the Hub
    try:
        from transformers import PreTrainedTokenizerFast
    except ImportError as err:
        raise DataError(f"--chat: transformers is not installed ({err.name}); fix: {EXTRA}") from err
    try:
        tok = PreTrainedTokenizerFast.from_pretrained(str(folder), local_files_only=True)
    except (OSError, ValueError) as err:
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise DataError(f"--tokenizer: cannot load {folder} with transformers ({reason}); fix: {EXTRA}") from err
    if not getattr(tok, "chat_template", None):
        raise DataError(
            f"--tokenizer: {folder} has no chat template (no chat_template in tokenizer_config.json); "
            f"fix: use the tokenizer of an instruct model, or add a chat_template to its tokenizer_config.json"
        )
    if not getattr(tok, "is_fast", False):
        raise DataError(f"--tokenizer: {folder} has no fast tokenizer (tokenizer.json); fix: {EXTRA}")
    return tok


NAMED_TEMPLATES = "additional_chat_templates"
"""The folder of named chat templates (``NAME.jinja``) beside a tokenizer (transformers' ``CHAT_TEMPLATE_DIR``)."""


def folder_template(folder: Path) -> str | dict[str, str] | None:
    """The chat template of Hugging Face tokenizer folder ``folder`` as transformers loads it, read from the files
    alone (no transformers): the template files take priority over the config, as in transformers'
    ``from_pretrained``: ``chat_template.jinja`` (named ``default``) and the named templates of
    ``additional_chat_templates/`` (a ``default`` alone is a string, several a dict by name); without them the
    config's ``chat_template`` (a string, or named templates as a dict); ``None`` when it has none;
    ``DataError`` naming a template or config file that is there but cannot be read (a FIFO, bad JSON)."""
    config_file = folder / "tokenizer_config.json"
    try:
        files = _template_files(folder)
        if files:
            return files["default"] if list(files) == ["default"] else files
        config = read_json(config_file, dict)
    except FileReadError as err:
        if config_file.exists() or config_file.is_symlink() or (folder / "chat_template.jinja").exists():
            raise DataError(f"data.tokenizer: {err}") from None  # there but unreadable: not "no chat template"
        return None
    template = config.get("chat_template")
    if isinstance(template, list):  # [{"name": ..., "template": ...}, ...]
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        return {k: v for k, v in named.items() if isinstance(k, str) and isinstance(v, str)} or None
    return template if isinstance(template, str) and template else None


def named_template_files(folder: Path) -> list[Path]:
    """The named chat templates of tokenizer folder ``folder`` (``additional_chat_templates/NAME.jinja``), sorted."""
    named = folder / NAMED_TEMPLATES
    return sorted(named.glob("*.jinja")) if named.is_dir() else []


def _template_files(folder: Path) -> dict[str, str]:
    """``chat_template.jinja`` as ``default`` and ``additional_chat_templates/NAME.jinja`` as ``NAME``."""
    files = {}
    if (folder / "chat_template.jinja").is_file():
        files["default"] = read_text(folder / "chat_template.jinja")
    for path in named_template_files(folder):
        files[path.name.removesuffix(".jinja")] = read_text(path)
    return files


def template_sha256(template: str | dict[str, str] | None) -> str | None:
    """sha256 of a chat template (named templates: of their JSON, keys sorted); ``None`` without one."""
    if not template:
        return None
    text = template if isinstance(template, str) else json.dumps(template, sort_keys=True)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def messages_of(line: str, path: Path, number: int) -> Messages:
    """The conversation of one JSONL line (``messages``, or ``prompt`` + ``completion``); ``DataError`` naming
    ``path:number`` otherwise."""
    where = f"{path}:{number}"
    try:
        record = json.loads(line)
    except json.JSONDecodeError as err:
        raise DataError(f'{where}: not valid JSON ({err.msg}); fix: one {{"messages": [...]}} object per line') from err
    if isinstance(record, dict) and "messages" not in record and {"prompt", "completion"} <= record.keys():
        record = {
            "messages": [
                {"role": "user", "content": record["prompt"]},
                {"role": "assistant", "content": record["completion"]},
            ]
        }
    if not isinstance(record, dict) or not isinstance(record.get("messages"), list) or not record["messages"]:
        raise DataError(
            f'{where}: no "messages" list (nor "prompt" and "completion"); '
            f'fix: {{"messages": [{{"role": "user", "content": "..."}}, {{"role": "assistant", "content": "..."}}]}}'
        )
    for k, m in enumerate(record["messages"]):
        if not isinstance(m, dict) or m.get("role") not in ROLES or not isinstance(m.get("content"), str):
            raise DataError(
                f'{where}: messages[{k}] is not {{"role": one of {", ".join(ROLES)}, "content": a string}} '
                f"({_shape(m)}); fix: give every message a role and a string content"
            )
        require_utf8(m["content"], f"{where}: messages[{k}]")
    if not any(m["role"] == "assistant" for m in record["messages"]):
        raise DataError(f"{where}: no assistant message, so nothing would carry loss; fix: add the assistant's answer")
    return [{"role": m["role"], "content": m["content"]} for m in record["messages"]]


def _shape(message: object) -> str:
    """What is wrong with a message, by its shape: never its text (no error quotes the input)."""
    if not isinstance(message, dict):
        return f"it is {type_name(message)}"
    if message.get("role") not in ROLES:
        return "no role" if "role" not in message else f"its role is {type_name(message['role'])} of no such name"
    return f"its content is {type_name(message.get('content'))}"


def _render(tok: Any, messages: Messages, generation_prompt: bool, where: str) -> str:
    try:
        text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)
    except Exception as err:  # jinja2's TemplateError, or the template's own raise_exception
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise DataError(
            f"{where}: the chat template refuses this conversation ({reason}); fix: the turn order it expects"
        ) from err
    return str(text)


def assistant_spans(tok: Any, messages: Messages, where: str) -> tuple[str, list[tuple[int, int]]]:
    """The rendered conversation and the ``[start, end)`` character spans of its assistant turns."""
    full = _render(tok, messages, False, where)
    spans = []
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        head = _render(tok, messages[:i], True, where) if i else ""
        turn = _render(tok, messages[: i + 1], False, where)
        if not (turn.startswith(head) and full.startswith(turn)):
            raise DataError(
                f"{where}: the chat template does not render turn {i} as a prefix of the whole conversation, "
                f"so its assistant tokens cannot be found; fix: a template that renders turns in order"
            )
        spans.append((len(head), len(turn)))
    return full, spans


def content_spans(tok: Any, messages: Messages, full: str, where: str) -> list[tuple[int, int]]:
    """The ``[start, end)`` character spans of the messages' contents in their rendered conversation ``full``.

    The conversation is rendered again with each content replaced by a slot that no content holds; the text
    between the slots is the template's own, and each slot is the content (as given, or stripped, as
    templates ``| trim`` it) at that place of ``full``. A template that changes contents otherwise is refused."""
    mark = "\ue000"
    while any(mark in m["content"] for m in messages):
        mark += "\ue000"
    slotted = [{**m, "content": f"{mark}{i}\ue001"} for i, m in enumerate(messages)]
    parts = re.split(f"{re.escape(mark)}(\\d+)\ue001", _render(tok, slotted, False, where))
    spans, pos = [], 0
    for k in range(0, len(parts) - 1, 2):
        content = messages[int(parts[k + 1])]["content"]
        pos += len(parts[k]) if full.startswith(parts[k], pos) else len(full) + 1
        rendered = next((c for c in (content, content.strip()) if full.startswith(c, pos)), None)
        if rendered is None or pos > len(full):
            break
        spans.append((pos, pos + len(rendered)))
        pos += len(rendered)
    else:
        if full[pos:] == parts[-1]:
            return spans
    raise DataError(
        f"{where}: the chat template changes the messages' text, so their content cannot be told apart from the "
        f"template's markers; fix: a template that writes each content as it is"
    )


def _encode(tok: Any, text: str, plain: list[tuple[int, int]]) -> tuple[list[int], list[int]]:
    """Ids and start offsets of ``text``: an added token (``<|end|>``...) the template wrote is its special id;
    the same text inside a content span is encoded as plain text, like every other character of a message."""
    added = tok.get_added_vocab()
    ids: list[int] = []
    starts: list[int] = []
    pos = 0

    def plain_run(a: int, b: int) -> None:
        if a < b:
            enc = tok(text[a:b], add_special_tokens=False, split_special_tokens=True, return_offsets_mapping=True)
            ids.extend(enc["input_ids"])
            starts.extend(a + s for s, _ in enc["offset_mapping"])

    if added:
        pattern = re.compile("|".join(re.escape(t) for t in sorted(added, key=len, reverse=True)))
        for m in pattern.finditer(text):
            if any(a < m.end() and m.start() < b for a, b in plain):
                continue  # inside a message: plain text
            plain_run(pos, m.start())
            ids.append(added[m.group()])
            starts.append(m.start())
            pos = m.end()
    plain_run(pos, len(text))
    return ids, starts


def encode_conversation(tok: Any, messages: Messages, where: str) -> tuple[numpy.ndarray, numpy.ndarray]:
    """Token ids (int64) of the rendered conversation and its mask (uint8, 1 = an assistant token). Only the
    template's own markers are special tokens: special-token text inside a message (``a<|endoftext|>b``) is
    encoded as plain text, so a message cannot end a document or forge a turn."""
    text, spans = assistant_spans(tok, messages, where)
    found, offsets = _encode(tok, text, content_spans(tok, messages, text, where))
    ids = numpy.asarray(found, dtype=numpy.int64)
    starts = numpy.asarray(offsets, dtype=numpy.int64)
    mask = numpy.zeros(len(ids), dtype=numpy.uint8)
    for a, b in spans:
        mask[(starts >= a) & (starts < b)] = 1
    return ids, mask
