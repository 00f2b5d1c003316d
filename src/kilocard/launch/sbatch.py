"""The run directory and batch script of a Slurm run (the verb is ``kilocard.commands.sbatch``).

Order the verb follows (nothing is written unless every config of the sweep passes every step before it):
  1. compose (``launcher=slurm`` unless the overrides choose a launcher), one config per sweep point;
  2. secret references (``kilocard.config.secrets``): a ``launcher.env``/``cluster.env`` value
     ``${oc.env:NAME}`` under the key ``NAME`` becomes a pass-through name in ``launcher.secret_env``
     (never resolved to disk); any other spelling or resolver is refused;
  3. ``kilocard.validate.validate`` (the Slurm launcher rules included) and the input-path checks:
     every error of every config is printed; any error -> exit 1, nothing written, nothing submitted;
  4. a dry render (every value quoted or rejected) -> then the run directory (frozen config,
     sha256, provenance), ``plan.json``, ``logs/`` and ``submit.sbatch``;
  5. ``--submit``: the ``sbatch`` client and every secret are checked before step 4; then
     ``sbatch --parsable`` (``--chain N``: N jobs, afterany; see ``kilocard.launch.slurm``), ids in
     ``jobs.json``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig

from kilocard.base import shell
from kilocard.config.compose import to_run_config
from kilocard.config.schema import RunConfig
from kilocard.launch.abspaths import absolute_paths
from kilocard.launch.package import stage_code
from kilocard.launch.render import LOG_DIR, render_script
from kilocard.launch.rundir import create_run_dir, runs_root
from kilocard.plan import LaunchPlan, build_plan
from kilocard.rundir.freeze import load_verified
from kilocard.validate.issues import Issue, error

SCRIPT_FILE = "submit.sbatch"
PLAN_FILE = "plan.json"


@dataclass
class Prepared:
    """One sweep point that passed validation and a dry render."""

    overrides: list[str]
    """The overrides of this sweep point."""
    cfg: DictConfig
    """Composed config (secret references already turned into names)."""
    run_cfg: RunConfig
    """Typed config."""
    plan: LaunchPlan
    """Processes and environment."""


def with_slurm_launcher(overrides: Sequence[str]) -> list[str]:
    """Prepend ``launcher=slurm`` unless the user picked a launcher option."""
    if any(o.split("=", 1)[0].lstrip("+~") == "launcher" for o in overrides):
        return list(overrides)
    return ["launcher=slurm", *overrides]


def as_frozen(cfg: DictConfig) -> RunConfig:
    """The typed config as ``create_run_dir`` freezes it (every path absolute against the cwd,
    ``kilocard.launch.abspaths``): what a preview renders; a written run renders its frozen file itself."""
    return to_run_config(absolute_paths(cfg, Path.cwd()))


def dry_render_issues(cfg: DictConfig, plan: LaunchPlan, chain: int) -> list[Issue]:
    """Render the script in memory from the config as it will be frozen: a value that cannot go into it
    safely is an ``SBATCH_VALUE`` error."""
    frozen = as_frozen(cfg)
    try:
        render_script(frozen, plan, runs_root(frozen) / "dry-render", chain)
    except shell.ShellValueError as e:
        return [error("SBATCH_VALUE", e.field, e.value, str(e), f"set {e.field} to a value of the allowed form")]
    return []


def write_run(p: Prepared, chain: int) -> Path:
    """Create the run directory and write plan.json, logs/ and the batch script; return the script path."""
    stage = lambda d: stage_code(d, p.run_cfg.launcher.packaging)  # noqa: E731 - the code goes in before the rename
    run_dir = create_run_dir(p.cfg, p.overrides, root=runs_root(p.run_cfg), stage=stage)
    # the script and plan come from the frozen file (its paths absolute), never from the config as typed
    frozen, _ = load_verified(run_dir)
    plan = build_plan(frozen)
    (run_dir / PLAN_FILE).write_text(plan.to_json())
    (run_dir / LOG_DIR).mkdir()
    script = run_dir / SCRIPT_FILE
    script.write_text(render_script(frozen, plan, run_dir, chain))
    script.chmod(0o755)
    return script
