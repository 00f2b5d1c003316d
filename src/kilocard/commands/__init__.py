"""The ``kilocard`` verbs: one module per verb, each owning its arguments, its rendering and its exit code.

A verb module has ``HELP`` (one line), ``add_arguments(parser)`` and ``execute(args) -> int``; the
domain modules it calls return values (a ``Report``, a ``Plan``, a run directory) and print
nothing. ``COMMANDS`` is the explicit verb table; ``main`` parses the command line, dispatches, and
turns a ``ComposeError`` into one line and exit 2. Exit codes: ``kilocard.commands.exits``; how an
issue or an error is printed: ``kilocard.commands.output``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from types import ModuleType

from kilocard import __version__
from kilocard.base.quiet import quiet_library_warnings
from kilocard.commands import (
    baselines,
    budget,
    convert,
    exits,
    goodput,
    image,
    logs,
    plan,
    preprocess,
    recipes,
    report,
    run,
    sbatch,
    show,
    validate,
)
from kilocard.commands.output import fail
from kilocard.config.compose import ComposeError

#: The verb table, in the order ``kilocard --help`` lists it (frozen by tests/commands/test_cli_surface.py).
COMMANDS: dict[str, ModuleType] = {
    "recipes": recipes,
    "show": show,
    "validate": validate,
    "run": run,
    "preprocess": preprocess,
    "sbatch": sbatch,
    "baselines": baselines,
    "plan": plan,
    "budget": budget,
    "image": image,
    "logs": logs,
    "convert": convert,
    "goodput": goodput,
    "report": report,
}
VERBS = tuple(COMMANDS)


def build_parser() -> argparse.ArgumentParser:
    """The whole command line: one subparser per verb, its arguments from the verb's module."""
    ap = argparse.ArgumentParser(prog="kilocard", description="Recipe -> validated Megatron-Core run on Slurm.")
    ap.add_argument("--version", action="version", version=f"kilocard {__version__}", help="print the version")
    sub = ap.add_subparsers(dest="verb", metavar="VERB")
    sub.required = True
    for verb, module in COMMANDS.items():
        module.add_arguments(
            sub.add_parser(
                verb,
                help=module.HELP,
                description=module.HELP,
                epilog="examples:\n" + "\n".join(f"  {e}" for e in module.EXAMPLES),
                formatter_class=argparse.RawDescriptionHelpFormatter,
            )
        )
    return ap


def parse_args(argv: list[str]) -> argparse.Namespace:
    """Parse the command line; flags and Hydra overrides may come in any order.

    argparse stops collecting the ``overrides`` positional at the first flag; overrides after a
    flag (``recipe=x --multirun a=1,2``) come back as unknown tokens and are appended here.
    """
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    unknown = [t for t in extra if t.startswith("-")]
    if unknown or (extra and not hasattr(args, "overrides")):
        parser.error(f"unrecognized arguments: {' '.join(unknown or extra)}")
    if extra:
        args.overrides = [*args.overrides, *extra]
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Run one verb; return its exit code (argparse exits 2 itself on a bad flag)."""
    args = parse_args(list(argv) if argv is not None else sys.argv[1:])
    quiet_library_warnings()
    try:
        return COMMANDS[args.verb].execute(args)
    except ComposeError as e:
        return fail(args.verb, str(e), exits.USAGE)
    except KeyboardInterrupt:
        print(f"kilocard {args.verb}: interrupted", file=sys.stderr)
        return exits.INTERRUPTED


__all__ = ["COMMANDS", "VERBS", "build_parser", "main", "parse_args"]
