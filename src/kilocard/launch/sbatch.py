"""``kilocard sbatch``: validate, write the run directory and batch script, optionally submit.

Order (nothing is written unless every config of the sweep passes every step before it):
  1. compose (``launcher=slurm`` unless the overrides choose a launcher), one config per sweep point;
  2. secret references: a ``launcher.env``/``cluster.env`` value ``${oc.env:NAME}`` under the key
     ``NAME`` becomes a pass-through name in ``launcher.secret_env`` (never resolved to disk);
  3. ``kilocard.validate.validate`` + the launcher rules (``kilocard.launch.checks``): every error
     of every config is printed; any error -> exit 1, nothing written, nothing submitted;
  4. a dry render (every value quoted or rejected) -> then the run directory (frozen config,
     sha256, provenance), ``plan.json``, ``logs/`` and ``submit.sbatch``;
  5. ``--submit``: ``sbatch --parsable`` (``--chain N``: N jobs, afterany), ids in ``jobs.json``.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig, OmegaConf, open_dict

from kilocard.config.compose import ComposeError, compose_many, to_run_config
from kilocard.config.schema import RunConfig
from kilocard.launch import preview, shell
from kilocard.launch.package import stage_code
from kilocard.launch.render import LOG_DIR, render_script
from kilocard.launch.rundir import RunDirError, create_run_dir
from kilocard.launch.slurm import SlurmError, missing_secrets, record_jobs, sbatch_argv, submit_chain
from kilocard.plan import LaunchPlan, build_plan
from kilocard.validate import validate
from kilocard.validate.issues import ERROR, Issue

EXIT_OK, EXIT_INVALID = 0, 1
SCRIPT_FILE = "submit.sbatch"
PLAN_FILE = "plan.json"
ENV_REF = re.compile(r"\$\{(?:oc\.)?env:([A-Za-z_][A-Za-z0-9_]*)(?:,[^}]*)?\}")


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


def extract_secret_refs(cfg: DictConfig) -> list[str]:
    """Move ``${oc.env:NAME}`` env values into ``launcher.secret_env``; refuse them anywhere else."""
    moved: list[str] = []
    raw = OmegaConf.to_container(cfg, resolve=False)
    assert isinstance(raw, dict)
    for group in ("launcher", "cluster"):
        env = (raw.get(group) or {}).get("env") or {}
        for key, value in env.items():
            m = ENV_REF.fullmatch(str(value)) if isinstance(value, str) else None
            if m is None:
                continue
            if m.group(1) != key:
                raise ComposeError(
                    f"{group}.env.{key}: a secret is passed through under its own name; use "
                    f"launcher.secret_env=[{m.group(1)}] and read {m.group(1)} in the job",
                    field=f"{group}.env.{key}",
                )
            with open_dict(cfg):
                del cfg[group].env[key]
                if key not in cfg.launcher.secret_env:
                    cfg.launcher.secret_env.append(key)
            moved.append(key)
    rest = OmegaConf.to_yaml(OmegaConf.create(OmegaConf.to_container(cfg, resolve=False)))
    if "env:" in rest and ENV_REF.search(rest):
        raise ComposeError(
            "an ${oc.env:...} reference outside launcher.env/cluster.env would write the variable's "
            "value into the run directory; pass secrets with launcher.secret_env=[NAME]"
        )
    return moved


def print_issues(label: str, issues: Sequence[Issue]) -> None:
    """Every error (and warning) on stderr, one line each with its fix."""
    for i in issues:
        value = "<hidden>" if "secret" in i.field else i.value
        print(f"{label}{i.severity} {i.code} {i.field}={value!r}: {i.message} (fix: {i.hint})", file=sys.stderr)


def prepare(overrides: Sequence[str], cfg: DictConfig, chain: int, multi: bool) -> Prepared | None:
    """Validate one sweep point and render it in memory; ``None`` (after printing why) when it fails."""
    label = f"[{' '.join(overrides)}] " if multi else ""
    extract_secret_refs(cfg)
    run_cfg = to_run_config(cfg)
    issues = list(validate(run_cfg).issues)  # the validator includes the Slurm launcher rules
    print_issues(label, issues)
    if any(i.severity == ERROR for i in issues):
        return None
    plan = build_plan(run_cfg)
    root = Path(run_cfg.cluster.shared_fs).expanduser().resolve()
    try:
        render_script(run_cfg, plan, root / "dry-render", chain)
    except shell.ShellValueError as e:
        print(f"{label}error SBATCH_VALUE {e}", file=sys.stderr)
        return None
    return Prepared(list(overrides), cfg, run_cfg, plan)


def write_run(p: Prepared, chain: int) -> Path:
    """Create the run directory and write plan.json, logs/ and the batch script; return the script path."""
    root = Path(p.run_cfg.cluster.shared_fs).expanduser().resolve()
    run_dir = create_run_dir(p.cfg, p.overrides, root=root, stage=lambda d: stage_code(d, p.run_cfg.launcher.packaging))
    (run_dir / PLAN_FILE).write_text(p.plan.to_json())
    (run_dir / LOG_DIR).mkdir()
    script = run_dir / SCRIPT_FILE
    script.write_text(render_script(p.run_cfg, p.plan, run_dir, chain))
    script.chmod(0o755)
    return script


def sbatch_command(
    overrides: Sequence[str],
    multirun: bool = False,
    submit: bool = False,
    chain: int = 1,
    dry_run: bool = False,
    test_only: bool = False,
) -> int:
    """The ``kilocard sbatch`` verb; returns the process exit code."""
    if chain < 1:
        raise ComposeError(f"--chain: {chain} is not a job count; use 1 or more", field="--chain", value=chain)
    points = compose_many(with_slurm_launcher(overrides), multirun)
    prepared = [prepare(o, c, chain, multi=len(points) > 1) for o, c in points]
    if any(p is None for p in prepared):
        bad = sum(p is None for p in prepared)
        print(
            f"kilocard sbatch: {bad} of {len(prepared)} config(s) invalid; nothing written, nothing submitted",
            file=sys.stderr,
        )
        return EXIT_INVALID
    missing = (
        sorted({n for p in prepared if p is not None for n in missing_secrets(p.plan.secret_env)}) if submit else []
    )
    if missing:
        print(
            f"kilocard sbatch: error: launcher.secret_env: {', '.join(missing)} not set in this shell; export "
            f"them before submitting; nothing written, nothing submitted",
            file=sys.stderr,
        )
        return EXIT_INVALID
    if dry_run or test_only:  # nothing written, nothing submitted
        runs = [(p.run_cfg, p.plan) for p in prepared if p is not None]
        return preview.dry_run(runs, chain) if dry_run else preview.test_only(runs, chain)
    status = EXIT_OK
    for p in prepared:
        assert p is not None
        try:
            script = write_run(p, chain)
        except RunDirError as e:
            print(f"kilocard sbatch: error: {e}", file=sys.stderr)
            return EXIT_INVALID
        argv = sbatch_argv(script, p.plan.secret_env, parsable=False)
        print(f"run dir: {script.parent}")
        print(f"script: {script}")
        print(
            f"sbatch: {' '.join(shell.quote('script', a) for a in argv)}"
            + (f"  (x{chain}, chained afterany)" if chain > 1 else "")
        )
        if submit:
            status = max(status, submit_run(p, script, chain))
    return status


def submit_run(p: Prepared, script: Path, chain: int) -> int:
    """Submit one prepared run and record its job ids; print them."""
    try:
        ids = submit_chain(script, chain, p.plan.secret_env)
    except SlurmError as e:
        print(f"kilocard sbatch: error: {e}", file=sys.stderr)
        return EXIT_INVALID
    record_jobs(script.parent, ids, chain, sbatch_argv(script, p.plan.secret_env))
    print(f"job id{'s' if len(ids) > 1 else ''}: {' '.join(str(i) for i in ids)}")
    return EXIT_OK
