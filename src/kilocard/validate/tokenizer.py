"""Tokenizer rules: ``data.tokenizer`` names a tokenizer that exists, and the padded vocabulary covers its ids.

Megatron pads the embedding to ``model.vocab_size`` rounded up to ``make_vocab_size_divisible_by * TP``;
a token id at or above that size has no embedding row. ``RULES`` is pure (the built-in
``kilocard-bytes``, whose 258 ids are known without reading anything); ``tokenizer_issues`` reads the
tokenizer file (existence, format, vocabulary size) and belongs to the input checks that the verbs
run beside ``validate()``.
"""

from __future__ import annotations

from collections.abc import Iterable

from kilocard.config.megatron import padded_vocab_size, vocab_multiple
from kilocard.config.schema import BYTES_TOKENIZER, RunConfig
from kilocard.layout import Layout
from kilocard.validate.issues import Issue, error

BYTES_VOCAB = 258
"""``kilocard.data.byte_tokenizer.ByteTokenizer().vocab_size`` (a test keeps them equal; validate stays torch-free)."""


def vocab_issues(cfg: RunConfig, tokenizer_vocab: int) -> list[Issue]:
    """An error when the padded ``model.vocab_size`` is smaller than ``tokenizer_vocab``."""
    m = cfg.model
    if m.vocab_size < 1 or m.make_vocab_size_divisible_by < 1 or cfg.parallel.tensor_model_parallel_size < 1:
        return []  # the model-shape and parallel rules report these
    padded = padded_vocab_size(m, cfg.parallel.tensor_model_parallel_size)
    if padded >= tokenizer_vocab:
        return []
    multiple = vocab_multiple(m, cfg.parallel.tensor_model_parallel_size)
    return [
        error(
            "TOKENIZER_VOCAB",
            "model.vocab_size",
            m.vocab_size,
            f"model.vocab_size={m.vocab_size} padded to a multiple of make_vocab_size_divisible_by"
            f"({m.make_vocab_size_divisible_by}) * tp({cfg.parallel.tensor_model_parallel_size}) = {multiple} "
            f"is {padded}, fewer than the {tokenizer_vocab} ids of tokenizer {cfg.data.tokenizer!r}",
            f"set model.vocab_size={tokenizer_vocab}",
        )
    ]


def rule_builtin_tokenizer_vocab(cfg: RunConfig, lay: Layout) -> Iterable[Issue]:
    """With ``kilocard-bytes``, the padded vocabulary holds its 258 ids (pure: nothing is read)."""
    if cfg.data.tokenizer == BYTES_TOKENIZER:
        yield from vocab_issues(cfg, BYTES_VOCAB)


RULES = (rule_builtin_tokenizer_vocab,)


def tokenizer_issues(cfg: RunConfig) -> list[Issue]:
    """Reads ``data.tokenizer`` when it is a file: it must exist and load, and the padded vocabulary must cover it.

    Not a ``validate()`` rule (it reads files): the verbs' input checks call it. Loading imports
    Megatron-Core and the tokenizer libraries, so it is imported here only when called.
    """
    if cfg.data.tokenizer == BYTES_TOKENIZER:
        return []
    from kilocard.data.errors import DataError
    from kilocard.data.tokenizer import get_tokenizer

    try:
        tok = get_tokenizer(cfg.data.tokenizer)
    except DataError as err:
        message, fix = err.parts()
        return [error("TOKENIZER_FILE", "data.tokenizer", cfg.data.tokenizer, message, fix or "set data.tokenizer")]
    return vocab_issues(cfg, tok.vocab_size)
