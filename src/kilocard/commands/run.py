"""``kilocard run``: validate, write a run directory (or resume one), train on local ranks.

Before the ranks start it exits with the command codes (``kilocard.commands.exits``): 1 for an
invalid config (all its issues printed, nothing written), 2 for input it cannot use (a bad flag, a
config that does not compose, a run directory that is missing, altered or not writable). Once the
ranks start it returns the trainer's code (``kilocard.exitcodes``).
"""

from __future__ import annotations

import argparse
import shlex
import tempfile
from pathlib import Path

from kilocard.commands import exits
from kilocard.commands.common import add_config_args, add_path_check_arg, check_config, typed
from kilocard.commands.output import count_line, fail, print_issues
from kilocard.config.compose import compose
from kilocard.config.schema import RunConfig
from kilocard.launch.local import launch
from kilocard.launch.refusals import CONFIG, ENVIRONMENT, PLACEMENT, RUN, Target, launch_issues
from kilocard.launch.rundir import RunDirError, create_run_dir
from kilocard.layout import world_size
from kilocard.rundir.checkpoint import checkpoint_root, completed_step
from kilocard.rundir.freeze import FrozenConfigError, load_verified
from kilocard.validate.issues import ERROR, Issue

HELP = "validate, write a run dir and train on local ranks (torchrun)"
#: Shown under ``kilocard run --help`` (each parsed by tests/commands/test_cli_help.py).
EXAMPLES = (
    "kilocard run recipe=tiny_gpt cluster=local_cpu --nproc 2 trainer.train_iters=5",
    "kilocard run --resume runs/tiny_gpt-20260101-120000",
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Overrides, ``--skip-path-checks``, ``--nproc``, ``--resume``."""
    add_config_args(p, multirun=False)
    add_path_check_arg(p)
    p.add_argument("--nproc", type=int, default=None, help="local ranks (default: launcher.nproc)")
    p.add_argument("--resume", default=None, metavar="RUN_DIR", help="continue a stopped run")


def nproc_overrides(nproc: int | None) -> list[str]:
    """``--nproc N``: one node of N ranks."""
    if nproc is None:
        return []
    return [f"cluster.gpus_per_node={nproc}", "cluster.nodes=1", f"launcher.nproc={nproc}"]


def refusal(target: Target, stage: str, skip: tuple[str, ...] = ()) -> int | None:
    """The exit code after printing the first thing ``run``'s launch checks of ``stage`` refuse (one line, exit 2),
    or ``None`` (``kilocard.launch.refusals``: the list ``validate`` reports too)."""
    refused = launch_issues(target, RUN, stage, skip)
    return fail("run", refused[0].message, exits.USAGE) if refused else None  # the first alone: fix it, then the next


def config_refusal(issues: list[Issue]) -> int | None:
    """Print every issue (warnings too, e.g. the paths left unchecked; on stderr); exit 1 when one is an error."""
    print_issues(issues)
    if any(i.severity == ERROR for i in issues):
        return fail("run", f"the config is invalid ({count_line(issues)}); nothing was started", exits.INVALID)
    return None


def new_run(overrides: list[str], skip_paths: bool = False) -> Path | int:
    """Compose, check and write a new run directory; its path, or the exit code after printing why not.

    Where the run goes (this machine, the run root) is checked first: a refusal there comes alone, before
    any warning about the config; then the config (the validator, input paths, packages); then the
    environment (secrets), before anything is written."""
    cfg = compose(overrides)
    target = Target(cfg, typed(cfg))
    code = refusal(target, PLACEMENT)
    if code is not None:
        return code
    _, report = check_config(cfg, skip_paths)
    code = config_refusal(report.issues + launch_issues(target, RUN, CONFIG))
    if code is None:
        code = refusal(target, ENVIRONMENT)
    if code is not None:
        return code
    try:
        return shown(create_run_dir(cfg, overrides))
    except RunDirError as e:
        return fail("run", str(e), exits.USAGE)


def shown(run_dir: Path) -> Path:
    """``run_dir`` (absolute) relative to the cwd when it lies under it (``runs/kilocard-...``), else as is."""
    try:
        return run_dir.relative_to(Path.cwd())
    except ValueError:
        return run_dir


def unwritable(run_dir: Path) -> str | None:
    """Why the ranks could not write into ``run_dir`` (checkpoints, logs, metrics), or ``None``."""
    try:
        with tempfile.NamedTemporaryFile(dir=run_dir, prefix=".kilocard-probe-"):
            pass
    except OSError as e:
        return f"--resume {run_dir}: the run directory is not writable ({e.strerror}); make it writable or copy it"
    return None


def resumable(resume: str, overrides: list[str]) -> Path | int:
    """The run directory to resume, or the exit code after printing why it cannot be resumed."""
    if overrides:
        return fail("run", "--resume takes no overrides (the run's frozen config is used)", exits.USAGE)
    run_dir = Path(resume)
    if not run_dir.is_dir():
        return fail("run", f"--resume {resume}: no such run directory", exits.USAGE)
    problem = unwritable(run_dir)
    return fail("run", problem, exits.USAGE) if problem else run_dir


def complete_line(run_dir: Path, run_cfg: RunConfig, step: int) -> str:
    """What ``--resume`` of a complete run prints instead of starting its ranks."""
    root, iters = checkpoint_root(run_dir, run_cfg), run_cfg.trainer.train_iters
    return (
        f"kilocard run: {run_dir} is complete: step {step} is committed (trainer.train_iters={iters});"
        f" nothing to train. Its figures: kilocard report {shlex.quote(str(run_dir))}; to train on, start a new run "
        f"with checkpoint.load={shlex.quote(str(root))} and a larger trainer.train_iters"
    )


def resume_refusal(frozen: RunConfig) -> int | None:
    """``run``'s launch checks on a run being resumed (its run root is where it already is)."""
    target = Target(None, frozen)
    code = refusal(target, PLACEMENT, skip=("RUN_ROOT",))
    if code is None:
        code = config_refusal(launch_issues(target, RUN, CONFIG))
    return code if code is not None else refusal(target, ENVIRONMENT)


def execute(args: argparse.Namespace) -> int:
    """Prepare the run directory, then hand it to the local launcher."""
    if args.nproc is not None and args.nproc < 1:
        return fail("run", f"--nproc {args.nproc}: must be >= 1", exits.USAGE)
    overrides = list(args.overrides)
    made = (
        resumable(args.resume, overrides)
        if args.resume
        else new_run(overrides + nproc_overrides(args.nproc), args.skip_path_checks)
    )
    if isinstance(made, int):
        return made
    run_dir = made
    print(f"run dir: {run_dir}", flush=True)
    try:
        frozen, _ = load_verified(run_dir)
    except FrozenConfigError as e:
        return fail("run", str(e), exits.USAGE)
    if args.resume and (step := completed_step(run_dir, frozen)) is not None:
        print(complete_line(run_dir, frozen, step), flush=True)
        return exits.OK  # no rank started: nothing to train
    code = resume_refusal(frozen) if args.resume else None  # a new run: new_run checked
    if code is not None:
        return code
    world = world_size(frozen.cluster)
    if args.resume and args.nproc is not None and args.nproc != world:
        return fail(
            "run",
            f"--nproc {args.nproc} differs from the run's world size {world}; resume onto another layout with a new "
            "run and checkpoint.load=<dir>",
            exits.USAGE,
        )
    return launch(run_dir, world, frozen.launcher.max_restarts)
