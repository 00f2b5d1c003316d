"""Each ``data.data_path`` prefix against the run: its record (``PREFIX.meta.json``), its split (I/O).

Not ``validate()`` rules (they read files): ``validate.inputpaths.input_path_issues`` runs them with
the other input checks. For every prefix of ``data.data_path``:

- ``DATA_TOKENIZER_MISMATCH``: the record's tokenizer (its file's sha256, or ``kilocard-bytes``) is not
  the run's ``data.tokenizer``: the ids mean other words;
- ``DATA_VOCAB``: the record's largest token id has no row in the padded ``model.vocab_size`` (the run
  would die with an ``IndexError`` in the embedding);
- ``DATA_RECORD_MISSING`` (a warning): a prefix without a record (data from before records, or from
  another tool) is used as before, unchecked;
- ``DATA_RECORD_STALE``: the record's document and token counts are not the ``.idx``'s (another dataset's
  ``.bin/.idx`` copied over the prefix);
- ``SFT_LOSS_MASK``: with ``data.sft`` the prefix has no loss-mask dataset (``PREFIX_loss_mask``) beside
  it (``data.sft`` on mock data is ``kilocard.validate.dataset``'s); ``SFT_LOSS_MASK_MISMATCH``: its documents
  are not the prefix's (a mask of another dataset);
- ``SFT_OFF`` (a warning): the prefix was made by ``preprocess --chat`` but ``data.sft`` is false, so
  system and user tokens carry loss too;
- ``SFT_TOO_LONG`` (a warning): with ``data.sft``, conversations longer than ``model.seq_length + 1`` tokens (the
  ``.idx``'s lengths, counted): their tokens past one sequence carry no loss (cut by ``data.packing=false``, or the
  piece in the next packed sequence, which has lost its prompt, with ``data.reset_attention_mask``; without it
  that piece is trained on);
- ``SFT_NO_LOSS``: with ``data.sft``, no conversation has an assistant token among the labels trained on (a
  warning when only some have none);
- ``SFT_TRUNCATED`` (a warning): the record says ``preprocess --chat --max-length --on-overflow truncate`` cut
  conversations, and how many;
- ``SFT_CHAT_TEMPLATE``: with ``data.sft``, the ``data.tokenizer`` folder has no chat template, so the fine-tuned
  model cannot be prompted the way it learned; ``SFT_TEMPLATE_CHANGED`` (a warning): its template is not the
  one the conversations were rendered with (the record's sha256);
- ``EVAL_SPLIT_EMPTY``: with ``trainer.eval_interval`` set, ``data.split`` gives the prefix (its document
  count from the record, or the ``.idx`` header) no validation document.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy

from kilocard.config.schema import RunConfig
from kilocard.data.chat import folder_template, template_sha256
from kilocard.data.errors import DataError
from kilocard.data.paths import resolve_data_prefix, split_blend
from kilocard.data.record import (
    HF_FILE,
    DataRecord,
    describe,
    document_lengths,
    index_documents,
    loss_tokens,
    mask_prefix,
    read_record,
    tokenizer_file,
    tokenizer_sha256,
)
from kilocard.data.split import SPLITS, VALID, split_documents, split_weights
from kilocard.perf.params import padded_vocab_size
from kilocard.validate.issues import Issue, error, warning


def data_record_issues(cfg: RunConfig) -> list[Issue]:
    """Every record and split issue of the prefixes of ``data.data_path`` (prefixes that do not exist are
    the path rules' to report)."""
    if cfg.data.type != "indexed":
        return []  # data.sft on mock data is kilocard.validate.dataset's
    try:
        prefixes, weights = split_blend(cfg.data.data_path)
        run_sha = tokenizer_sha256(cfg.data.tokenizer)
    except (DataError, OSError):
        return []  # the blend, path and tokenizer rules report these
    out: list[Issue] = []
    records: list[tuple[str, DataRecord]] = []
    for n, prefix in enumerate(prefixes):
        field = f"data.data_path[{n if weights is None else 2 * n + 1}]"
        try:
            resolved = resolve_data_prefix(prefix)
            record = read_record(resolved)
        except DataError as err:
            if "not found" not in str(err):
                what, how = err.parts()
                out.append(error("DATA_RECORD", field, prefix, what.removeprefix("data.data_path: "), how))
            continue
        if record is not None and record.publishing:
            out.append(_interrupted(field, prefix, record))
            continue
        if record is None:
            out.append(_missing(field, prefix, cfg.data.tokenizer))
            documents = index_documents(resolved)
        else:
            out += _against_run(cfg, field, prefix, record, run_sha)
            out += stale_record_issues(field, prefix, resolved, record)
            documents = record.documents
            records.append((prefix, record))
        out += _sft_issues(cfg, field, prefix, resolved, record)
        if cfg.data.sft:
            out += mask_match_issues(field, prefix, resolved)
            out += too_long_issues(cfg, field, prefix, document_lengths(resolved))
            out += truncated_issues(field, prefix, record)
            out += no_loss_issues(cfg, field, prefix, resolved)
        out += _valid_documents(cfg, field, prefix, documents)
    return out + template_issues(cfg, records)


def _index_counts(prefix: str) -> tuple[int, int] | None:
    """``(documents, tokens)`` of ``PREFIX.idx`` (one sequence per document, as ``kilocard preprocess`` writes), or
    ``None`` when it is not a Megatron-Core index."""
    lengths = document_lengths(prefix)
    return None if lengths is None else (len(lengths), int(lengths.sum(dtype=numpy.int64)))


def stale_record_issues(field: str, prefix: str, resolved: str, record: DataRecord) -> list[Issue]:
    """``DATA_RECORD_STALE``: the record's documents and tokens are not those of the ``.idx`` beside it (another
    dataset's ``.bin/.idx`` copied over the prefix): every check of the record would be of other data, and the
    ranks read past the documents (an ``IndexError`` after the queue)."""
    counts = _index_counts(resolved)
    if counts is None or counts == (record.documents, record.tokens):
        return []
    return [
        error(
            "DATA_RECORD_STALE",
            field,
            prefix,
            f"{prefix}.meta.json describes {record.documents} documents and {record.tokens} tokens, but {prefix}.idx "
            f"holds {counts[0]} documents and {counts[1]} tokens: the .bin/.idx are not the ones it was written with",
            "run `kilocard preprocess` for this prefix again (copy a dataset's .bin, .idx and .meta.json together)",
        )
    ]


def mask_match_issues(field: str, prefix: str, resolved: str) -> list[Issue]:
    """``SFT_LOSS_MASK_MISMATCH``: the loss mask beside the prefix (``PREFIX_loss_mask``) has other documents than
    the prefix (a mask of another dataset): every sample would take its loss from other text's turns."""
    data, mask = document_lengths(resolved), document_lengths(mask_prefix(resolved))
    if data is None or mask is None or (len(data) == len(mask) and numpy.array_equal(data, mask)):
        return []
    return [
        error(
            "SFT_LOSS_MASK_MISMATCH",
            field,
            prefix,
            f"{mask_prefix(prefix)}.idx holds {len(mask)} documents of {int(mask.sum(dtype=numpy.int64))} tokens, "
            f"but {prefix}.idx holds {len(data)} of {int(data.sum(dtype=numpy.int64))}: the loss mask belongs to "
            "another dataset",
            "run `kilocard preprocess --chat` for this prefix again (it writes the data and its mask together)",
        )
    ]


def _sft_issues(cfg: RunConfig, field: str, prefix: str, resolved: str, record: DataRecord | None) -> list[Issue]:
    """``SFT_LOSS_MASK`` for a prefix without its loss mask under ``data.sft``; ``SFT_OFF`` for chat data without."""
    masked = mask_prefix(resolved)
    has_mask = Path(f"{masked}.bin").is_file() and Path(f"{masked}.idx").is_file()
    if cfg.data.sft and not has_mask:
        return [
            error(
                "SFT_LOSS_MASK",
                field,
                prefix,
                f"data.sft=true but {prefix} has no loss mask ({mask_prefix(prefix)}.bin/.idx)",
                "build the data with `kilocard preprocess --chat`, or data.sft=false to train on every token",
            )
        ]
    if not cfg.data.sft and record is not None and record.assistant_tokens is not None:
        return [
            warning(
                "SFT_OFF",
                "data.sft",
                False,
                f"{field} {prefix} holds conversations (preprocess --chat) but data.sft=false: system and user "
                f"tokens carry loss too",
                "data.sft=true to train on the assistant tokens only",
            )
        ]
    return []


SCAN_CHUNK = 1 << 20
"""Lengths compared at a time by ``too_long_issues`` (a megabyte of comparisons, however many conversations)."""


def too_long_issues(
    cfg: RunConfig, field: str, prefix: str, lengths: Sequence[int] | numpy.ndarray | None
) -> list[Issue]:
    """``SFT_TOO_LONG``: conversations of ``prefix`` (their token counts, EOD included; an array is scanned without
    a copy) that one sequence of ``model.seq_length + 1`` tokens (the inputs and the last target) does not hold."""
    fits = cfg.model.seq_length + 1
    counts = lengths if isinstance(lengths, numpy.ndarray) else numpy.asarray(lengths or [], dtype=numpy.int64)
    longer = sum(int(numpy.count_nonzero(counts[i : i + SCAN_CHUNK] > fits)) for i in range(0, len(counts), SCAN_CHUNK))
    if not longer:
        return []
    longest = int(counts.max())
    return [
        warning(
            "SFT_TOO_LONG",
            "model.seq_length",
            cfg.model.seq_length,
            f"{field} {prefix}: {longer} of {len(counts)} conversations are longer than "
            f"model.seq_length + 1 = {fits} tokens (the longest {longest}); {_past_a_sequence(cfg)}",
            f"model.seq_length={longest - 1}, or decide at preprocessing: `kilocard preprocess --chat "
            f"--max-length {fits} --on-overflow refuse` (or truncate, counted in the record)",
        )
    ]


def no_loss_issues(cfg: RunConfig, field: str, prefix: str, resolved: str) -> list[Issue]:
    """``SFT_NO_LOSS``: no conversation of ``prefix`` has an assistant token among the labels the run trains on
    (cut at ``model.seq_length`` with ``data.packing=false``): the loss and every gradient would be 0, a run that
    "trains" without learning. A warning when only some have none (they cost steps and teach nothing)."""
    counts = loss_tokens(resolved, None if cfg.data.packing else cfg.model.seq_length)
    if counts is None or not len(counts):
        return []
    empty = int(numpy.count_nonzero(counts == 0))
    if not empty:
        return []
    where = "in their first model.seq_length tokens" if not cfg.data.packing else "at all"
    if empty == len(counts):
        return [
            error(
                "SFT_NO_LOSS",
                field,
                prefix,
                f"{field} {prefix}: none of its {len(counts)} conversations has an assistant token {where}: "
                "every loss and gradient would be 0",
                "a longer model.seq_length, shorter prompts, or preprocess --chat without --on-overflow truncate "
                "cutting the answers off",
            )
        ]
    return [
        warning(
            "SFT_NO_LOSS",
            field,
            prefix,
            f"{field} {prefix}: {empty} of {len(counts)} conversations have no assistant token {where}: "
            "their samples teach nothing",
            f"model.seq_length (now {cfg.model.seq_length}) above the longest prompt, or drop those conversations",
        )
    ]


def _past_a_sequence(cfg: RunConfig) -> str:
    """What becomes of a conversation's tokens past one sequence (``kilocard.data.sft``): cut with
    ``data.packing=false``; packed, its piece in the next sequence carries no loss with
    ``data.reset_attention_mask`` and is trained on without its prompt otherwise."""
    if cfg.data.packing and not cfg.data.reset_attention_mask:
        return "their tokens past that go on in the next sequence and are trained on without their prompt"
    return "their tokens past that carry no loss"


def truncated_issues(field: str, prefix: str, record: DataRecord | None) -> list[Issue]:
    """``SFT_TRUNCATED``: the record counts conversations ``preprocess --chat --on-overflow truncate`` cut."""
    if record is None or not record.truncated:
        return []
    return [
        warning(
            "SFT_TRUNCATED",
            field,
            prefix,
            f"{prefix}: {record.truncated} of {record.documents} conversations were cut to --max-length "
            f"{record.max_length} tokens by `kilocard preprocess --chat --on-overflow truncate`",
            "what was cut is never trained on; preprocess again with a larger --max-length to keep it",
        )
    ]


def template_issues(cfg: RunConfig, records: list[tuple[str, DataRecord]]) -> list[Issue]:
    """``SFT_CHAT_TEMPLATE`` when the ``data.tokenizer`` folder of an SFT run has no chat template;
    ``SFT_TEMPLATE_CHANGED`` for each prefix rendered with another template than the folder's."""
    if not cfg.data.sft:
        return []
    try:
        found = tokenizer_file(cfg.data.tokenizer)
        if found is None or found.name != HF_FILE:
            return []  # not a Hugging Face folder: DATA_TOKENIZER_MISMATCH names the one the data was made with
        folder = found.parent
        sha = template_sha256(folder_template(folder))
    except DataError as err:
        what, fix = err.parts()
        return [error("SFT_CHAT_TEMPLATE", "data.tokenizer", cfg.data.tokenizer, what, fix or "fix the file")]
    if sha is None:
        return [
            error(
                "SFT_CHAT_TEMPLATE",
                "data.tokenizer",
                cfg.data.tokenizer,
                f"{folder} has no chat template (tokenizer_config.json's chat_template, or chat_template.jinja): "
                f"the fine-tuned model could not be prompted the way it learned",
                "the tokenizer folder `kilocard preprocess --chat` rendered the conversations with",
            )
        ]
    return [
        warning(
            "SFT_TEMPLATE_CHANGED",
            "data.tokenizer",
            cfg.data.tokenizer,
            f"{prefix} was rendered with chat template sha256 {record.chat_template_sha256[:12]}, but "
            f"{folder}'s is {sha[:12]}",
            f"preprocess again with `kilocard preprocess --chat --tokenizer {cfg.data.tokenizer}`",
        )
        for prefix, record in records
        if record.chat_template_sha256 is not None and record.chat_template_sha256 != sha
    ]


def _interrupted(field: str, prefix: str, record: DataRecord) -> Issue:
    """``DATA_INCOMPLETE``: the record is still marked ``publishing``: preprocess stopped while it renamed the new
    ``.bin/.idx`` into place, so they may be half old, half new (token ids read past the documents, or silently
    the wrong ones)."""
    return error(
        "DATA_INCOMPLETE",
        field,
        prefix,
        f"{prefix}: kilocard preprocess was cut off while it put the new .bin/.idx in place "
        f"({prefix}.meta.json still says publishing): the files may be half old, half new",
        f"run `kilocard preprocess` for it again (tokenizer {record.tokenizer})",
    )


def _missing(field: str, prefix: str, tokenizer: str) -> Issue:
    return warning(
        "DATA_RECORD_MISSING",
        field,
        prefix,
        f"{prefix} has no record of the tokenizer that made it ({prefix}.meta.json): its token ids are not "
        f"checked against data.tokenizer and model.vocab_size",
        f"rebuild it with `kilocard preprocess --tokenizer {tokenizer}` to record them",
    )


def _against_run(cfg: RunConfig, field: str, prefix: str, record: DataRecord, run_sha: str | None) -> list[Issue]:
    """The record's tokenizer and largest id against the run's ``data.tokenizer`` and ``model.vocab_size``."""
    out = []
    run = cfg.data.tokenizer
    same = record.tokenizer_sha256 == run_sha and (run_sha is not None or record.tokenizer == run)
    if not same:
        out.append(
            error(
                "DATA_TOKENIZER_MISMATCH",
                "data.tokenizer",
                run,
                f"{field} {prefix} was tokenized with {record.identity()}, but data.tokenizer is "
                f"{describe(run, run_sha)}",
                f"set data.tokenizer={record.tokenizer}, or rebuild the data with "
                f"`kilocard preprocess --tokenizer {run}`",
            )
        )
    m, tp = cfg.model, cfg.parallel.tensor_model_parallel_size
    if m.vocab_size >= 1 and m.make_vocab_size_divisible_by >= 1 and tp >= 1:
        padded = padded_vocab_size(m, tp)
        if record.max_token_id >= padded:
            out.append(
                error(
                    "DATA_VOCAB",
                    "model.vocab_size",
                    m.vocab_size,
                    f"{field} {prefix} holds token ids up to {record.max_token_id} ({record.identity()}), but "
                    f"model.vocab_size={m.vocab_size} pads to {padded} embedding rows",
                    f"set model.vocab_size={max(record.vocab_size, record.max_token_id + 1)}",
                )
            )
    return out


def _valid_documents(cfg: RunConfig, field: str, prefix: str, documents: int | None) -> list[Issue]:
    """``EVAL_SPLIT_EMPTY`` when evaluation is on and ``data.split`` gives this prefix no validation document."""
    if not cfg.trainer.eval_interval or documents is None:
        return []
    try:
        weights = split_weights(cfg.data.split)
    except DataError:
        return []  # DATA_SPLIT reports it
    if weights[VALID] == 0 or split_documents(weights, documents)[VALID] >= 1:
        return []  # no share at all is rule_eval_split's
    return [
        error(
            "EVAL_SPLIT_EMPTY",
            "data.split",
            cfg.data.split,
            f"data.split={cfg.data.split!r} gives {field} {prefix} ({documents} documents) no {SPLITS[VALID]} "
            f"document, but trainer.eval_interval={cfg.trainer.eval_interval} evaluates on it",
            "a larger valid weight (e.g. data.split='90,10,0'), more documents, or trainer.eval_interval=null",
        )
    ]
