"""Render the Slurm batch script of a run from its config and launch plan (``slurm/train.sbatch.tmpl``).

The template has ``{{ name }}`` slots and no logic; this module fills each slot with text built
from checked or quoted values (``kilocard.base.shell``), so the script never executes a config
value. The renderer decides no sizes: processes and environment come from the ``LaunchPlan``.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from kilocard.base import shell
from kilocard.base.slurmtime import time_to_seconds
from kilocard.config.schema import RunConfig
from kilocard.launch.package import CODE_DIR, PREFLIGHT, SITE_DIR, mcore_range
from kilocard.paths import data_dir
from kilocard.plan import LaunchPlan

TEMPLATE = "train.sbatch.tmpl"
SLOT = re.compile(r"\{\{\s*(\w+)\s*\}\}")
LOG_DIR = "logs"


class RenderError(ValueError):
    """The template and the values given to it do not match (a bug, not bad input)."""


def fill(template: str, values: dict[str, str]) -> str:
    """Replace every ``{{ name }}`` in ``template``; every slot must have a value and vice versa."""
    slots = set(SLOT.findall(template))
    missing, unused = slots - set(values), set(values) - slots
    if missing or unused:
        raise RenderError(f"template slots without values: {sorted(missing)}; values without slots: {sorted(unused)}")
    return SLOT.sub(lambda m: values[m.group(1)], template)


def sbatch_lines(cfg: RunConfig, plan: LaunchPlan, run_dir: Path) -> list[str]:
    """The ``#SBATCH`` directives, each value checked against its safe character set."""
    c, lc = cfg.cluster, cfg.launcher
    logs = shell.sbatch_value("cluster.shared_fs", str(run_dir / LOG_DIR), "path")
    time_to_seconds("launcher.time", lc.time)
    opts = [
        f"--job-name={shell.sbatch_value('launcher.job_name', lc.job_name, 'name')}",
        f"--nodes={plan.nodes}",
        f"--ntasks-per-node={plan.tasks_per_node}",
    ]
    if plan.on_gpu:
        opts.append(f"--gpus-per-node={plan.gpus_per_node}")
    opts.append(f"--cpus-per-task={plan.cpus_per_task}")
    if lc.exclusive:
        opts.append("--exclusive")
    opts += [f"--mem={shell.sbatch_value('cluster.mem_per_node', c.mem_per_node, 'memory')}", f"--time={lc.time}"]
    for name, fld, value in (
        ("partition", "cluster.partition", c.partition),
        ("account", "cluster.account", c.account),
        ("qos", "cluster.qos", c.qos),
    ):
        checked = shell.optional_sbatch(fld, value, "name")
        if checked:
            opts.append(f"--{name}={checked}")
    opts += [f"--output={logs}/slurm-%j.out", f"--error={logs}/slurm-%j.out", "--open-mode=append"]
    opts.append("--requeue" if lc.requeue else "--no-requeue")
    opts.append(f"--signal=USR1@{int(lc.signal_lead_s)}")
    dep = shell.optional_sbatch("launcher.dependency", lc.dependency, "dependency")
    if dep:
        opts.append(f"--dependency={dep}")
    opts += [shell.extra_sbatch(f"launcher.extra_sbatch[{i}]", o) for i, o in enumerate(lc.extra_sbatch)]
    return [f"#SBATCH {o}" for o in opts]


def env_exports(plan: LaunchPlan, cfg: RunConfig) -> list[str]:
    """``export NAME='value'`` for every plan variable, names checked and values single-quoted."""
    lines = []
    for name, value in plan.env.items():
        field = f"launcher.env.{name}" if name in cfg.launcher.env else f"cluster.env.{name}"
        lines.append(f"export {shell.env_name(field, name)}={shell.quote(field, value)}")
    return lines


def secret_checks(plan: LaunchPlan) -> str:
    """Fail fast when a pass-through secret was not exported; the value is never in the script."""
    lines = []
    for name in plan.secret_env:
        shell.env_name("launcher.secret_env", name)
        lines.append(
            f'[ -n "${{{name}+set}}" ] || '
            f'{{ log "secret {name} not in the environment (export it before sbatch)"; exit 2; }}'
        )
    if not lines:
        return ""
    return "# Secrets come from the submitting environment (sbatch --export); only their names are here.\n" + "\n".join(
        lines
    )


def runtime_setup(cfg: RunConfig) -> str:
    """Bare metal: activate ``cluster.venv`` on the batch node (srun passes the environment on)."""
    c = cfg.cluster
    if c.container_image or not c.venv:
        return "# Python: " + (
            "inside the container image (pyxis)"
            if c.container_image
            else "`python` from the submitting environment's PATH"
        )
    venv = shell.quote("cluster.venv", c.venv)
    return f"# Bare metal: the cluster profile's virtual environment.\nsource {venv}/bin/activate || exit 1"


def container_mounts(cfg: RunConfig, run_dir: Path) -> list[str]:
    """pyxis mounts: the profile's, plus each host path the job reads or writes that none of them covers.

    Needed paths: the run directories' root (config, code snapshot, checkpoints, logs), absolute data
    prefixes' folders, an absolute tokenizer file's folder and absolute checkpoint/cache folders.
    A path under another needed path, or under a profile mount's source, adds nothing.
    """
    mounts = list(cfg.cluster.container_mounts)
    for i, m in enumerate(mounts):
        if "," in m:
            raise shell.ShellValueError(f"cluster.container_mounts[{i}]", m, "src:dst[:flags] without commas")
    d, ck = cfg.data, cfg.checkpoint
    wanted = [str(run_dir.parent)]
    wanted += [os.path.dirname(p) for p in d.data_path if isinstance(p, str) and os.path.isabs(p)]
    if os.path.isabs(d.tokenizer):
        wanted.append(os.path.dirname(d.tokenizer))
    wanted += [p for p in (ck.save, ck.load, d.path_to_cache) if p and os.path.isabs(p)]
    covered = [m.split(":")[0] for m in mounts]
    for path in sorted(set(wanted), key=len):
        if not any(path == c or path.startswith(c.rstrip("/") + "/") for c in covered):
            mounts.append(f"{path}:{path}")
            covered.append(path)
    return mounts


def container_args(cfg: RunConfig, run_dir: Path) -> list[str]:
    """pyxis options (none on bare metal); a named container: every step of the job reuses one import."""
    c = cfg.cluster
    if not c.container_image:
        return []
    return [
        f"--container-image={shell.quote('cluster.container_image', c.container_image)}",
        "--container-name=kilocard",
        f"--container-mounts={shell.quote('cluster.container_mounts', ','.join(container_mounts(cfg, run_dir)))}",
        '--container-workdir="$RUN_DIR"',
    ]


def srun_args(cfg: RunConfig, plan: LaunchPlan, run_dir: Path) -> str:
    """srun options of the training step: the process layout, per-rank labelled output, the container."""
    args = [
        f"--nodes={plan.nodes}",
        f"--ntasks={plan.world_size}",
        f"--ntasks-per-node={plan.tasks_per_node}",
        f"--cpus-per-task={plan.cpus_per_task}",
        "--kill-on-bad-exit=0",
        "--label",
    ]
    return " ".join(args + container_args(cfg, run_dir))


def preflight_command(cfg: RunConfig, plan: LaunchPlan, run_dir: Path, python: str) -> str:
    """One task per node runs ``preflight.py`` (copied into the run dir) with the job's python."""
    low, below = mcore_range()
    args = [f"--nodes={plan.nodes}", f"--ntasks={plan.nodes}", "--ntasks-per-node=1", "--kill-on-bad-exit=0"]
    gpus = plan.gpus_per_node if plan.on_gpu else 0
    flags = [f"--gpus-per-node {gpus}", f"--mcore-min {low}", f"--mcore-below {below}"]
    if cfg.precision.fp8 or cfg.precision.fp4:
        flags.append("--need-te")
    argv = " ".join(args + container_args(cfg, run_dir))
    return f'srun {argv} {python} "$RUN_DIR/{PREFLIGHT}" "$RUN_DIR" {" ".join(flags)}'


def code_setup(cfg: RunConfig) -> str:
    """Where the job imports kilocard from (``launcher.packaging``, ``kilocard.launch.package``)."""
    mode = cfg.launcher.packaging
    if mode == "snapshot":
        return (
            "# Code: the snapshot of kilocard written at sbatch time (launcher.packaging=snapshot); first on the\n"
            "# path, so the submitting checkout (edited or deleted since) is never imported.\n"
            f'export PYTHONPATH="$RUN_DIR/{CODE_DIR}/{SITE_DIR}${{PYTHONPATH:+:$PYTHONPATH}}"'
        )
    if mode == "image":
        return "# Code: kilocard installed in the container image (launcher.packaging=image, `kilocard image`)."
    return "# Code: kilocard from the job's environment (launcher.packaging=none); the preflight checks it."


def master_port(plan: LaunchPlan) -> str:
    """MASTER_PORT: fixed (launcher.master_port) or derived from the job id and restart count."""
    if plan.master_port is not None:
        return f"export MASTER_PORT={int(plan.master_port)}"
    return (
        "# derived from the job id (+ restart count: a requeued job gets a fresh port)\n"
        "export MASTER_PORT=$(( 20000 + (SLURM_JOB_ID * 7 + ${SLURM_RESTART_COUNT:-0}) % 40000 ))"
    )


def render_script(cfg: RunConfig, plan: LaunchPlan, run_dir: Path, chain_length: int = 1) -> str:
    """The whole batch script for ``run_dir`` (absolute) as text."""
    run_dir = Path(run_dir)
    if not run_dir.is_absolute():
        raise RenderError(f"run directory {run_dir} must be absolute")
    lc = cfg.launcher
    python = "python" if cfg.cluster.container_image or not cfg.cluster.venv else '"$VIRTUAL_ENV/bin/python"'
    values = {
        "recipe": shell.sbatch_value("recipe.name", cfg.recipe.name, "name"),
        "cluster": shell.sbatch_value("cluster.name", cfg.cluster.name, "name"),
        "nodes": str(plan.nodes),
        "tasks_per_node": str(plan.tasks_per_node),
        "world_size": str(plan.world_size),
        "sbatch_lines": "\n".join(sbatch_lines(cfg, plan, run_dir)),
        "signal_lead_s": str(int(lc.signal_lead_s)),
        "max_requeues": str(int(lc.max_requeues)),
        "run_dir": shell.quote("cluster.shared_fs", str(run_dir)),
        "chain_length": str(int(chain_length)),
        "requeue": "1" if lc.requeue else "0",
        "secret_checks": secret_checks(plan),
        "env_exports": "\n".join(env_exports(plan, cfg)),
        "runtime_setup": runtime_setup(cfg),
        "master_port": master_port(plan),
        "code_setup": code_setup(cfg),
        "preflight": preflight_command(cfg, plan, run_dir, python),
        "srun_args": srun_args(cfg, plan, run_dir),
        "python": python,
    }
    return fill((data_dir("slurm") / TEMPLATE).read_text(), values)
