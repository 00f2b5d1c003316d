"""The ``kilocard`` verbs: one module per verb, each owning its arguments, its rendering and its exit code.

A verb module has ``HELP`` (one line), ``add_arguments(parser)`` and ``execute(args) -> int``; the
domain modules it calls return values (a ``Report``, a ``Plan``, a run directory) and print
nothing. ``COMMANDS`` is the explicit verb table; ``main`` parses the command line, dispatches, and is
the one error boundary of every verb (``boundary``: one line and a documented exit code, never a
traceback unless ``KILOCARD_DEBUG=1``). Exit codes: ``kilocard.commands.exits``; how an
issue or an error is printed: ``kilocard.commands.output``.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

from kilocard import __version__
from kilocard.base.quiet import DEBUG_ENV, debug, quiet_library_warnings
from kilocard.base.safe_read import FileReadError
from kilocard.base.shell import ShellValueError
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
    runs,
    sbatch,
    show,
    validate,
)
from kilocard.commands.output import fail
from kilocard.config.compose import ComposeError
from kilocard.rundir.targets import WriteTargetError

#: The exit codes a verb may return before any rank starts (``kilocard.commands.exits``); ``run``
#: returns the trainer's codes once ranks start.
DOCUMENTED_EXITS = frozenset({exits.OK, exits.INVALID, exits.USAGE, exits.INTERRUPTED, exits.PIPE})

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
    "runs": runs,
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
    """Run one verb; return its exit code (argparse exits 2 itself on a bad flag).

    The one error boundary of every verb: no input reaches a Python traceback. Errors of input that
    cannot be used (a config that does not compose, a file the safe reader refuses, a value that
    cannot go into a script) are one line and USAGE (2); an ``OSError`` (a disk, a permission) is one
    line naming the file and INVALID (1); anything else is a bug: one line saying so (the error's type
    and where it was raised, never its message, which may quote a file) and INVALID (1).
    ``KILOCARD_DEBUG=1`` lets the traceback through instead. A reader of stdout that went away
    (``kilocard validate --format json | head -c 10``) ends the verb quietly with PIPE (141), as a
    Unix tool ended by SIGPIPE does: no line (stdout is gone, and stderr would only say so) and no
    traceback, not even at interpreter exit.
    """
    try:
        args = parse_args(list(argv) if argv is not None else sys.argv[1:])
    except KeyboardInterrupt:  # the verbs' modules are imported here
        print("kilocard: interrupted", file=sys.stderr)
        return exits.INTERRUPTED
    quiet_library_warnings()
    try:
        code = COMMANDS[args.verb].execute(args)
        sys.stdout.flush()  # a closed pipe surfaces here, inside the boundary, not at interpreter exit
        return code
    except BrokenPipeError:
        return stdout_gone()
    except KeyboardInterrupt:
        print(f"kilocard {args.verb}: interrupted", file=sys.stderr)
        return exits.INTERRUPTED
    except Exception as e:
        if debug():  # KILOCARD_DEBUG=1: the traceback of an unexpected error instead of its one line
            raise
        return boundary(args.verb, e)


def stdout_gone() -> int:
    """PIPE, after pointing stdout at ``/dev/null`` so that nothing flushes into the closed pipe again
    (Python would print ``Exception ignored ... BrokenPipeError`` at exit)."""
    try:
        with open(os.devnull, "wb") as devnull:
            os.dup2(devnull.fileno(), sys.stdout.fileno())
    except (OSError, ValueError):  # a stdout without a descriptor (an in-process capture): nothing to flush
        pass
    return exits.PIPE


def boundary(verb: str, e: Exception) -> int:
    """The one line and exit code for an error that reached ``main`` (see ``main``)."""
    if isinstance(e, ComposeError | FileReadError | ShellValueError | WriteTargetError):
        return fail(verb, one_line(str(e)), exits.USAGE)
    if isinstance(e, OSError):
        where = f": {e.filename}" if e.filename is not None else ""
        return fail(verb, f"{e.strerror or type(e).__name__}{where}", exits.INVALID)
    frame = traceback.extract_tb(e.__traceback__)[-1] if e.__traceback__ else None
    at = f" at {Path(frame.filename).name}:{frame.lineno}" if frame else ""
    return fail(
        verb,
        f"internal error ({type(e).__name__}{at}); this is a bug in kilocard: please report it with the "
        f"command line, and rerun with {DEBUG_ENV}=1 for the traceback",
        exits.INVALID,
    )


def one_line(text: str) -> str:
    """``text`` on one line (a message that quotes a multi-line value keeps to one line)."""
    return " ".join(text.splitlines())


__all__ = ["COMMANDS", "DEBUG_ENV", "DOCUMENTED_EXITS", "VERBS", "boundary", "build_parser", "main", "parse_args"]
