"""``kilocard sbatch``: validate, write the run directory and batch script, optionally submit.

Nothing is written unless every sweep point passes validation and a dry render, and, with
``--submit``, unless ``sbatch`` is on the PATH and every secret is set. Exit 0 when every run was
written (and submitted), 1 when a config is invalid or Slurm refused a submission, 2 on bad input
(``--chain`` outside 1..``MAX_CHAIN``, a config that does not compose, an unwritable run directory).
A chain that breaks off at link k cancels its first k-1 links (see ``kilocard.launch.slurm``).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from omegaconf import DictConfig

from kilocard.base import shell
from kilocard.commands import exits
from kilocard.commands.common import add_config_args, add_path_check_arg, check_config
from kilocard.commands.output import fail, print_issues
from kilocard.config.compose import compose_many
from kilocard.launch import preview
from kilocard.launch.refusals import CONFIG, ENVIRONMENT, PLACEMENT, SBATCH, Target, launch_issues
from kilocard.launch.rundir import RunDirError
from kilocard.launch.sbatch import Prepared, as_frozen, with_slurm_launcher, write_run
from kilocard.launch.slurm import (
    ChainError,
    SlurmError,
    check_chain,
    missing_client,
    record_jobs,
    sbatch_argv,
    submit_chain,
)
from kilocard.plan import build_plan
from kilocard.validate.issues import ERROR, Issue

HELP = "validate and render (optionally submit) a Slurm batch script"
#: Shown under ``kilocard sbatch --help`` (each parsed by tests/commands/test_cli_help.py).
EXAMPLES = (
    "kilocard sbatch recipe=llama3_70b cluster=h100_dgx cluster.shared_fs=/lustre/me/runs --submit",
    "kilocard sbatch recipe=llama3_8b --dry-run > job.sh",
)
NOTHING_DONE = "nothing written, nothing submitted"


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Overrides, ``-m``, ``--skip-path-checks``, ``--submit``, ``--chain``, ``--dry-run``, ``--test-only``."""
    add_config_args(p)
    add_path_check_arg(p)
    p.add_argument("--submit", action="store_true", help="submit with sbatch --parsable")
    p.add_argument("--chain", type=int, default=1, help="submit N jobs that continue one another (N <= 100)")
    p.add_argument("--dry-run", action="store_true", help="print the script; write nothing")
    p.add_argument("--test-only", action="store_true", help="ask slurmctld (sbatch --test-only); submit nothing")


def prepare(
    overrides: list[str], cfg: DictConfig, chain: int, skip_paths: bool = False
) -> tuple[Prepared | None, list[Issue]]:
    """Validate one sweep point and render it in memory: the point (``None`` on any error) and its issues."""
    run_cfg, report = check_config(cfg, skip_paths)
    issues = list(report.issues)
    if any(i.severity == ERROR for i in issues):
        return None, issues
    issues += launch_issues(Target(cfg, run_cfg, chain), SBATCH, CONFIG)  # the dry render
    if any(i.severity == ERROR for i in issues):
        return None, issues
    return Prepared(overrides, cfg, run_cfg, build_plan(run_cfg, report.layout)), issues


def submit_problems(points: list[Prepared]) -> list[str]:
    """What stops a submission before anything is written: no ``sbatch`` client, secrets not exported."""
    problems = [p for p in (missing_client("sbatch"),) if p]
    missing = [i.value for p in points for i in launch_issues(Target(p.cfg, p.run_cfg), SBATCH, ENVIRONMENT)]
    names = sorted({n for names in missing for n in names})
    if names:
        problems.append(f"launcher.secret_env: {', '.join(names)} not set in this shell; export them before submitting")
    return problems


def print_written(script: Path, p: Prepared, chain: int) -> None:
    """``run dir:``, ``script:`` and the ``sbatch`` line."""
    argv = sbatch_argv(script, p.plan.secret_env, parsable=False)
    print(f"run dir: {script.parent}")
    print(f"script: {script}")
    print(
        f"sbatch: {' '.join(shell.quote('script', a) for a in argv)}"
        + (f"  (x{chain}, chained afterany)" if chain > 1 else "")
    )


def submit_run(p: Prepared, script: Path, chain: int) -> int:
    """Submit one written run, record its job ids in ``jobs.json`` and print them."""
    argv = sbatch_argv(script, p.plan.secret_env)
    try:
        ids = submit_chain(script, chain, p.plan.secret_env)
    except ChainError as e:
        return fail("sbatch", chain_failure(e, script, chain, argv), exits.INVALID)
    except SlurmError as e:
        return fail("sbatch", str(e), exits.INVALID)
    record_jobs(script.parent, ids, chain, argv)
    print(f"job id{'s' if len(ids) > 1 else ''}: {' '.join(str(i) for i in ids)}")
    return exits.OK


def chain_failure(e: ChainError, script: Path, chain: int, argv: list[str]) -> str:
    """The error line of a broken chain; records the queued links when they could not be cancelled."""
    ids = " ".join(str(i) for i in e.queued)
    if not e.queued:
        return f"{e}; nothing is queued (the run directory {script.parent} stays: fix the cause and resubmit)"
    if e.cancelled:
        return f"{e}; cancelled the {len(e.queued)} link(s) already queued ({ids}): nothing is queued"
    record_jobs(script.parent, e.queued, chain, argv, complete=False)
    return (
        f"{e}; could not cancel the {len(e.queued)} link(s) already queued ({e.cancel_error}); "
        f"recorded them in {script.parent / 'jobs.json'}: run `scancel {ids}`"
    )


def preview_runs(prepared: list[Prepared], chain: int, dry_run: bool) -> int:
    """``--dry-run`` prints each script; ``--test-only`` asks slurmctld. Nothing written or submitted."""
    runs = [(as_frozen(p.cfg), p.plan) for p in prepared]
    if dry_run:
        print(preview.dry_run(runs, chain), end="")
        return exits.OK
    try:
        answers = preview.test_only(runs, chain)
    except SlurmError as e:
        return fail("sbatch", f"{e}; nothing submitted", exits.INVALID)
    for answer in answers:
        print(f"test only (nothing submitted): {answer}")
    return exits.OK


def execute(args: argparse.Namespace) -> int:
    """Validate every sweep point, check the submission, then write (and submit) each run."""
    bad_chain = check_chain(args.chain)
    if bad_chain:
        return fail("sbatch", f"{bad_chain}; {NOTHING_DONE}", exits.USAGE)
    points = compose_many(with_slurm_launcher(args.overrides), args.multirun)
    prepared: list[Prepared] = []
    for overrides, cfg in points:
        p, issues = prepare(overrides, cfg, args.chain, args.skip_path_checks)
        print_issues(issues, label=f"[{' '.join(overrides)}] " if len(points) > 1 else "")
        if p is not None:
            prepared.append(p)
    if len(prepared) < len(points):
        bad = len(points) - len(prepared)
        return fail("sbatch", f"{bad} of {len(points)} config(s) invalid; {NOTHING_DONE}", exits.INVALID)
    problems = submit_problems(prepared) if args.submit else []
    if problems:
        return fail("sbatch", f"{'; '.join(problems)}; {NOTHING_DONE}", exits.INVALID)
    if args.dry_run or args.test_only:
        return preview_runs(prepared, args.chain, args.dry_run)
    refused = [i.message for p in prepared for i in launch_issues(Target(p.cfg, p.run_cfg), SBATCH, PLACEMENT)]
    roots = list(dict.fromkeys(refused))
    if roots:  # before any run directory of the sweep is written
        return fail("sbatch", f"{'; '.join(roots)}; {NOTHING_DONE}", exits.USAGE)
    status = exits.OK
    for p in prepared:
        try:
            script = write_run(p, args.chain)
        except RunDirError as e:
            return fail("sbatch", str(e), exits.USAGE)
        print_written(script, p, args.chain)
        if args.submit:
            status = max(status, submit_run(p, script, args.chain))
    return status
