"""``kilocard convert``: Hugging Face checkpoints in (``hf-to-mcore``) and out (``mcore-to-hf``).

``hf-to-mcore HF_DIR OUT_DIR [recipe=NAME] [overrides]`` writes a committed, model-only kilocard
checkpoint a run starts from with ``checkpoint.load=OUT_DIR``; ``mcore-to-hf CHECKPOINT OUT_DIR``
writes ``config.json`` and safetensors shards. Exit 0; 2 when what the command line points at cannot be
used (an output that exists, a source that is no model or checkpoint, an unreadable or damaged file, an
altered checkpoint, a bad flag); 1 when the model is refused (a mismatch with the recipe, an unsupported
family, weights the recipe's dtype cannot hold); one line naming what is wrong, nothing written. The
work is ``kilocard.convert``.
"""

from __future__ import annotations

import argparse
import warnings
from pathlib import Path

from kilocard.commands import exits
from kilocard.commands.common import add_config_args
from kilocard.commands.output import fail

HELP = "Hugging Face checkpoint <-> kilocard (Megatron-Core) checkpoint"
MAX_SHARD_SIZE = "5GB"
"""``mcore-to-hf``'s largest safetensors shard unless ``--max-shard-size`` says (Hugging Face's default)."""
#: Shown under ``kilocard convert --help`` (each parsed by tests/commands/test_cli_help.py).
EXAMPLES = (
    "kilocard convert hf-to-mcore ./Llama-3.2-1B ./ckpt",
    "kilocard convert hf-to-mcore ./Llama-3.2-1B ./ckpt recipe=llama3_8b",
    "kilocard convert mcore-to-hf RUN_DIR/checkpoints ./hf-out",
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """``DIRECTION SRC DST``, overrides (import), ``--max-shard-size`` (export)."""
    p.add_argument(
        "direction",
        choices=("hf-to-mcore", "mcore-to-hf"),
        help="import Hugging Face weights, or export a checkpoint to them",
    )
    p.add_argument("src", help="HF model directory, or a kilocard checkpoint (step) directory")
    p.add_argument("dst", help="output directory (must not exist or be empty)")
    add_config_args(p, multirun=False)
    p.add_argument(
        "--max-shard-size", default=None, help=f"mcore-to-hf: largest safetensors shard (default {MAX_SHARD_SIZE})"
    )
    p.add_argument(
        "--adapter-only",
        action="store_true",
        help="mcore-to-hf of a LoRA step: the adapter alone in the PEFT library's format, not merged",
    )


def execute(args: argparse.Namespace) -> int:
    """Convert; one line on success or failure."""
    # Megatron-Core warns at import that TE/Apex are absent: expected here, conversions run on CPU.
    warnings.filterwarnings("ignore", category=UserWarning, module=r"megatron\.")
    from kilocard.convert import st_io
    from kilocard.convert.command import hf_to_mcore, mcore_to_hf
    from kilocard.convert.maps import ConvertError, ConvertUsageError
    from kilocard.rundir.checkpoint import CheckpointError

    try:
        note = ""
        if args.direction == "hf-to-mcore":
            if flags := export_flags(args):
                raise ConvertUsageError(
                    f"{flags[0]} is a mcore-to-hf flag; hf-to-mcore would ignore it: drop it from the command"
                )
            note = "".join(f"; dropped {what}" for what in hf_to_mcore(Path(args.src), Path(args.dst), args.overrides))
        elif args.overrides:
            raise ConvertUsageError(
                f"mcore-to-hf takes no overrides (got {' '.join(args.overrides)}); "
                "the model comes from the checkpoint's saved config"
            )
        else:
            tokenizer, dropped = mcore_to_hf(
                Path(args.src),
                Path(args.dst),
                st_io.parse_size(MAX_SHARD_SIZE if args.max_shard_size is None else args.max_shard_size),
                args.adapter_only,
            )
            note = (
                f" (tokenizer from {tokenizer})"
                if tokenizer
                else " (no Hugging Face tokenizer recorded for this checkpoint: copy the model's tokenizer files "
                "beside the weights)"
            )
            note += "".join(f"; dropped {what}" for what in dropped)
    except (ConvertUsageError, CheckpointError) as e:  # a checkpoint that fails its checks cannot be used
        return fail("convert", str(e), exits.USAGE)
    except ConvertError as e:
        return fail("convert", str(e), exits.INVALID)
    print(f"kilocard convert: wrote {args.dst}{note}")
    return exits.OK


def export_flags(args: argparse.Namespace) -> list[str]:
    """The ``mcore-to-hf`` flags on the command line (``hf-to-mcore`` would ignore them)."""
    given = (("--adapter-only", args.adapter_only), ("--max-shard-size", args.max_shard_size is not None))
    return [flag for flag, on in given if on]
