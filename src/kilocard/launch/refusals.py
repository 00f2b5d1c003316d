"""Every check ``kilocard run`` and ``kilocard sbatch`` make before they write or launch a run, in one list
(``CHECKS``), so that ``kilocard validate`` reports exactly what they would refuse.

Besides the validator's rules and the input-path checks (``kilocard.commands.common.check_config``, which
all three verbs call), a launch is refused for what this machine or the submission lacks:

======================  =========  =============================================================  ===========
code                    verbs      what                                                           stage
======================  =========  =============================================================  ===========
``RUN_HERE``            run        the cluster profile is not this machine (GPUs, one node)       placement
``RESTARTS_UNAVAILABLE`` run       in-job restarts without a working NVIDIA Resiliency Extension  placement
``RUN_ROOT``            run,sbatch ``cluster.shared_fs`` cannot hold a run directory here         placement
``PACKAGE_MISSING``     run        a tracker the config turns on is not installed here            config
``CPU_RANKS``           run        more CPU ranks than this machine's cores can carry             config
``SBATCH_VALUE``        sbatch     a value the batch script cannot carry safely                   config
``SECRET_NOT_SET``      run,sbatch a ``launcher.secret_env`` name is not exported (sbatch:        environment
                                   with ``--submit``)
======================  =========  =============================================================  ===========

Stages say when a verb makes the check: ``placement`` first (where the run goes: a refusal there is
printed alone, before any warning about the config, exit 2), ``config`` with the validator's issues
(exit 1), ``environment`` after them, before anything is written (exit 2 for ``run``, 1 for
``sbatch --submit``). ``kilocard validate`` reports the checks of the verb the config's launcher names
(``launcher.kind``: ``local`` is ``run``, ``slurm`` is ``sbatch``) as issues; for a Slurm config the
checks that depend on the machine you submit from (``site``) are warnings, since validate may run
elsewhere (a laptop, not the login node). One check stays with ``sbatch --submit`` alone: that the
``sbatch`` client is on the PATH, a property of the submitting shell, not of the run.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, replace

from omegaconf import DictConfig

from kilocard.config.schema import RunConfig
from kilocard.launch.local import local_gpus, machine_mismatch, restart_problem
from kilocard.launch.rundir import shared_fs_problem
from kilocard.launch.sbatch import dry_render_issues
from kilocard.launch.slurm import missing_secrets
from kilocard.plan import build_plan
from kilocard.validate.issues import ERROR, WARNING, Issue, error
from kilocard.validate.launcher import local_core_issues
from kilocard.validate.packages import tracker_issues

RUN, SBATCH = "run", "sbatch"
PLACEMENT, CONFIG, ENVIRONMENT = "placement", "config", "environment"


@dataclass(frozen=True)
class Target:
    """What a check looks at: the composed config (secret references already names) and its typed form."""

    cfg: DictConfig | None
    """The composed config (``None`` for a frozen run being resumed: nothing is rendered again)."""
    run_cfg: RunConfig
    """The typed config."""
    chain: int = 1
    """``kilocard sbatch --chain``."""


@dataclass(frozen=True)
class LaunchCheck:
    """One launch-time check: its issue code, the verbs that make it, when, and the check."""

    code: str
    """The issue code of what it finds."""
    verbs: tuple[str, ...]
    """``run``, ``sbatch`` or both."""
    stage: str
    """``placement``, ``config`` or ``environment`` (the module docstring)."""
    site: bool
    """Whether it depends on the machine that launches or submits (not the config alone)."""
    find: Callable[[Target], list[Issue]]
    """The issues it finds (empty: nothing to refuse)."""
    needs_valid: bool = False
    """Made only on a config the validator found no error in (it renders the batch script)."""
    supersedes: tuple[str, ...] = ()
    """Validator codes that say the same thing less surely (a warning this check's error replaces)."""


def _run_here(t: Target) -> list[Issue]:
    c = t.run_cfg.cluster
    why = machine_mismatch(t.run_cfg, local_gpus() if c.gpu != "cpu" else [])
    value: object
    if c.nodes > 1:
        field, value, fix = "cluster.nodes", c.nodes, "cluster.nodes=1, or kilocard sbatch (launcher=slurm)"
    else:
        field, value, fix = "cluster.gpu", c.gpu, "cluster=local_cpu (CPU ranks here), or kilocard sbatch"
    return [error("RUN_HERE", field, value, why, fix)] if why else []


def _restarts(t: Target) -> list[Issue]:
    why = restart_problem(t.run_cfg)
    fix = "pip install 'kilocard[resiliency]', or launcher.max_restarts=0"
    return (
        [error("RESTARTS_UNAVAILABLE", "launcher.max_restarts", t.run_cfg.launcher.max_restarts, why, fix)]
        if why
        else []
    )


def _run_root(t: Target) -> list[Issue]:
    why = shared_fs_problem(t.run_cfg)
    fix = "cluster.shared_fs=<a directory here whose parent exists>"
    return [error("RUN_ROOT", "cluster.shared_fs", t.run_cfg.cluster.shared_fs, why, fix)] if why else []


def _secrets(t: Target) -> list[Issue]:
    missing = missing_secrets(t.run_cfg.launcher.secret_env)
    if not missing:
        return []
    names = ", ".join(missing)
    why = f"launcher.secret_env: {names} not in the environment (export it first)"
    return [error("SECRET_NOT_SET", "launcher.secret_env", missing, why, f"export {missing[0]}=... in this shell")]


def _sbatch_values(t: Target) -> list[Issue]:
    if t.cfg is None:
        return []
    return dry_render_issues(t.cfg, build_plan(t.run_cfg), t.chain)


CHECKS: tuple[LaunchCheck, ...] = (
    LaunchCheck("RUN_HERE", (RUN,), PLACEMENT, True, _run_here, supersedes=("LOCAL_MULTI_NODE",)),
    LaunchCheck("RESTARTS_UNAVAILABLE", (RUN,), PLACEMENT, True, _restarts),
    LaunchCheck("RUN_ROOT", (RUN, SBATCH), PLACEMENT, True, _run_root),
    LaunchCheck("PACKAGE_MISSING", (RUN,), CONFIG, True, lambda t: tracker_issues(t.run_cfg)),
    LaunchCheck("CPU_RANKS", (RUN,), CONFIG, True, lambda t: local_core_issues(t.run_cfg, os.cpu_count())),
    LaunchCheck("SBATCH_VALUE", (SBATCH,), CONFIG, False, _sbatch_values, needs_valid=True),
    LaunchCheck("SECRET_NOT_SET", (RUN, SBATCH), ENVIRONMENT, True, _secrets),
)
"""Every launch-time check, in the order a verb makes them."""


def launch_issues(t: Target, verb: str, stage: str, skip: tuple[str, ...] = ()) -> list[Issue]:
    """The issues of ``verb``'s checks of ``stage`` (codes in ``skip`` left out)."""
    return [i for c in CHECKS if verb in c.verbs and c.stage == stage and c.code not in skip for i in c.find(t)]


def verb_of(run_cfg: RunConfig) -> str:
    """The verb that launches ``run_cfg``: ``run`` for ``launcher.kind=local``, else ``sbatch``."""
    return RUN if run_cfg.launcher.kind == "local" else SBATCH


def validate_issues(t: Target, issues: list[Issue]) -> list[Issue]:
    """The validator's ``issues`` as ``kilocard validate`` reports them: followed by every check of the verb
    that launches the config, in order (a check that renders only where ``issues`` hold no error); for a Slurm
    config the site checks are warnings (validate may run on another machine). A check that finds something
    replaces the validator's issues it ``supersedes``."""
    verb = verb_of(t.run_cfg)
    valid = not any(i.severity == ERROR for i in issues)
    out: list[Issue] = []
    for check in CHECKS:
        if verb not in check.verbs or (check.needs_valid and not valid):
            continue
        soften = verb == SBATCH and check.site
        out += [
            replace(i, severity=WARNING, message=f"{i.message} (kilocard sbatch refuses it here)") if soften else i
            for i in check.find(t)
        ]
    gone = {code for c in CHECKS if any(i.code == c.code for i in out) for code in c.supersedes}
    said = {(i.code, i.field) for i in issues}  # a validator rule may say it already (CPU_RANKS of the profile)
    return [i for i in issues if i.code not in gone] + [i for i in out if (i.code, i.field) not in said]
