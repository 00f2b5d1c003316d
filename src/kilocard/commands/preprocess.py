"""``kilocard preprocess``: JSONL text -> a Megatron-Core indexed dataset (``.bin``/``.idx``)."""

from __future__ import annotations

import argparse

from kilocard.commands import exits
from kilocard.commands.output import fail
from kilocard.rundir.targets import output_prefix

HELP = "turn JSONL text into Megatron .bin/.idx"
#: Shown under ``kilocard preprocess --help`` (each parsed by tests/commands/test_cli_help.py).
EXAMPLES = (
    "kilocard preprocess --input corpus.jsonl --output-prefix data/corpus --tokenizer kilocard-bytes",
    "kilocard preprocess --chat --input conversations.jsonl --tokenizer HF_DIR --output-prefix data/sft",
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """``--input``, ``--output-prefix``, ``--tokenizer``, ``--workers``, ``--chat`` (``--max-length``,
    ``--on-overflow``)."""
    p.add_argument("--input", required=True, help="JSONL file, one {'text': ...} per line")
    p.add_argument("--output-prefix", required=True, help="output prefix (writes PREFIX_text_document.bin/.idx)")
    p.add_argument(
        "--tokenizer",
        default="kilocard-bytes",
        help="kilocard-bytes, or a local tokenizer.json / SentencePiece model / tiktoken BPE file (or its folder)",
    )
    p.add_argument("--workers", type=int, default=1, help="tokenizer processes (output identical for any count)")
    p.add_argument(
        "--chat",
        action="store_true",
        help="conversations ({'messages': [...]} or {'prompt', 'completion'}) rendered with the tokenizer folder's "
        "chat template; also writes PREFIX_text_document_loss_mask (1 on assistant tokens)",
    )
    p.add_argument(
        "--max-length",
        type=int,
        default=None,
        help="--chat: the most tokens a conversation may have, its end-of-document token included "
        "(the model's seq_length + 1 fits one sequence); unbounded when not given",
    )
    p.add_argument(
        "--on-overflow",
        choices=("refuse", "truncate"),
        default=None,
        help="--chat --max-length: a longer conversation is refused (exit 2, nothing written; the default) or cut "
        "to the length (counted in PREFIX.meta.json as truncated)",
    )


def execute(args: argparse.Namespace) -> int:
    """Write the dataset; 2 (one line naming the file, line and fix) on bad input."""
    # Imported here: the tokenizers and the writer load only for this verb (neither imports torch or Megatron-Core).
    from kilocard.data.errors import DataError
    from kilocard.data.preprocess import preprocess_chat, preprocess_jsonl
    from kilocard.data.record import mask_prefix

    if args.max_length is not None and not args.chat:
        return fail("preprocess", "--max-length: only with --chat; fix: add --chat, or drop --max-length", exits.USAGE)
    if args.on_overflow is not None and args.max_length is None:
        return fail(
            "preprocess",
            f"--on-overflow: only with --max-length (without one nothing is cut, so {args.on_overflow} would do "
            "nothing); fix: add --max-length N, or drop --on-overflow",
            exits.USAGE,
        )
    if args.chat and args.workers != 1:
        return fail(
            "preprocess",
            f"--workers: {args.workers} with --chat; fix: drop --workers (--chat renders in one process)",
            exits.USAGE,
        )
    output_prefix("--output-prefix", args.output_prefix)  # before any work: a prefix kilocard may write
    try:
        if args.chat:
            result = preprocess_chat(
                args.input, args.output_prefix, args.tokenizer, args.max_length, args.on_overflow or "refuse"
            )
        else:
            result = preprocess_jsonl(args.input, args.output_prefix, args.tokenizer, args.workers)
    except DataError as err:
        return fail("preprocess", str(err), exits.USAGE)
    print(
        f"wrote {result.prefix}.bin/.idx: {result.documents} documents, {result.tokens} tokens ({args.tokenizer}) "
        f"in {result.seconds:.1f} s, {result.documents_per_second:.0f} documents/s with {result.workers} worker(s)"
    )
    if result.assistant_tokens is not None:
        print(f"wrote {mask_prefix(result.prefix)}.bin/.idx: {result.assistant_tokens} assistant tokens carry loss")
    if result.truncated is not None:
        print(f"{result.truncated} conversation(s) longer than --max-length {args.max_length} cut to it")
    return exits.OK
