"""Render the Slurm batch script of a run from its config and launch plan (``slurm/train.sbatch.tmpl``).

The template has ``{{ name }}`` slots and no logic; this module fills each slot with text built
from checked or quoted values (``kilocard.base.shell``), so the script never executes a config
value. The renderer decides no sizes: processes and environment come from the ``LaunchPlan``.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from kilocard import exitcodes
from kilocard.base import shell
from kilocard.base.safe_read import read_text
from kilocard.base.slurmtime import time_to_seconds
from kilocard.config.schema import RunConfig
from kilocard.launch import ftlaunch
from kilocard.launch.package import CODE_DIR, PREFLIGHT, SITE_DIR, mcore_range
from kilocard.launch.rundir import job_name
from kilocard.paths import data_dir
from kilocard.plan import LaunchPlan
from kilocard.rundir.names import BLOCKLIST, EXIT_DIR_ENV
from kilocard.rundir.targets import mount_problem

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
        f"--job-name={shell.sbatch_value('launcher.job_name', job_name(cfg), 'name')}",
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
            problem = mount_problem(path)  # validate refused it already (MOUNT_PATH): never render it
            if problem:
                raise shell.ShellValueError("container mount", path, f"a path pyxis can mount (it {problem})")
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


END_WAIT_S = 30
"""``srun --wait``: seconds the other ranks may run on after the first rank's process ends. Ranks end
together (a commit sits between barriers), so only a rank that can no longer end by itself (stopped,
hung in a kernel) is still there: the healthy ranks' watchdog ends them FAULT after
``trainer.hang_timeout_s`` and srun then kills it, instead of the step waiting for the time limit."""


def srun_args(cfg: RunConfig, plan: LaunchPlan, run_dir: Path) -> str:
    """srun options of the training step: the process layout, per-rank labelled output, the container.

    In-job restarts: one ``ft_launcher`` task per node with every CPU (and GPU) the node's ranks
    have in the allocation; a launcher that ends non-zero (its restarts spent) or dies with its node
    ends the step at once (``--kill-on-bad-exit=1``): the other nodes' ranks do not wait for a
    collective timeout, and the script requeues. Output is labelled by node; the launcher adds the
    rank (``train_command``)."""
    if ftlaunch.in_job(cfg):
        args = [
            f"--nodes={plan.nodes}",
            f"--ntasks={plan.nodes}",
            "--ntasks-per-node=1",
            f"--cpus-per-task={plan.cpus_per_task * plan.tasks_per_node}",
        ]
        args += [f"--gpus-per-node={plan.gpus_per_node}"] if plan.on_gpu else []
        args += ["--kill-on-bad-exit=1", "--label"]
    else:
        args = [
            f"--nodes={plan.nodes}",
            f"--ntasks={plan.world_size}",
            f"--ntasks-per-node={plan.tasks_per_node}",
            f"--cpus-per-task={plan.cpus_per_task}",
            "--kill-on-bad-exit=0",
            f"--wait={END_WAIT_S}",
            "--label",
        ]
    return " ".join(args + container_args(cfg, run_dir))


def train_command(cfg: RunConfig, plan: LaunchPlan, python: str) -> str:
    """What each srun task runs, up to the run directory: the trainer, or (in-job restarts) one NVRx
    ``ft_launcher`` per node starting the node's ranks. The launcher starts with USR1 ignored (Slurm's
    ``--signal=USR1`` reaches every process of the step and would kill it); its ranks install their own
    handler (save, then RETRY). It tees the ranks' output with each line prefixed by the rank
    (``ftlaunch.TEE``), unbuffered (``-u``) so the lines reach the log as they are written."""
    nsys = nsys_prefix(cfg, plan)
    if not ftlaunch.in_job(cfg):
        return f"{nsys}{python} -m kilocard.train"
    args = ftlaunch.ft_launcher_args(
        cfg, nnodes='"$SLURM_NNODES"', nproc=plan.tasks_per_node, rdzv_endpoint='"$MASTER_ADDR:$MASTER_PORT"'
    )
    ignore_usr1 = 'bash -c \'trap "" USR1; exec "$@"\' ft_launcher'
    return f"{ignore_usr1} {nsys}{python} -u -m {ftlaunch.MODULE} {' '.join(args)} {ftlaunch.TEE} -m kilocard.train"


NSYS = (
    "nsys profile --capture-range=cudaProfilerApi --capture-range-end=stop --trace=cuda,nvtx,osrt "
    '--force-overwrite=true --output="$RUN_DIR/profile/nsys_node%q{SLURM_NODEID}_task%q{SLURM_PROCID}" '
)
"""Nsight Systems around each task (``trainer.nsys``): it records only between the ranks'
``cudaProfilerStart``/``Stop`` (``kilocard.train.profiling``), i.e. ``trainer.profile_steps``."""


def nsys_prefix(cfg: RunConfig, plan: LaunchPlan) -> str:
    """``NSYS`` when ``trainer.nsys`` is on and the ranks have GPUs, else nothing."""
    return NSYS if cfg.trainer.nsys and plan.on_gpu else ""


def host_python(cfg: RunConfig, run_dir: Path, python: str) -> str:
    """The python the batch shell runs kilocard's small helpers with: the job's, or inside the container
    image (one task) when there is one (the batch host may have no kilocard)."""
    if not cfg.cluster.container_image:
        return python
    return " ".join(["srun --nodes=1 --ntasks=1 --kill-on-bad-exit=0", *container_args(cfg, run_dir), "python"])


def label_note(cfg: RunConfig) -> str:
    """The batch script's comment on how the training step's output lines name their rank."""
    if not ftlaunch.in_job(cfg):
        return "# Each output line starts with its rank (srun --label): `kilocard logs RUN_DIR --rank N` picks one."
    return (
        "# Each output line starts with its node (srun --label), a rank's line then with its rank\n"
        f"# ({ftlaunch.LINE_PREFIX.replace('${rank}', 'N').strip()}, ft_launcher {ftlaunch.TEE}): "
        "`kilocard logs RUN_DIR --rank N` picks one."
    )


SIGNAL_ROW = "#   >128           a rank killed by a signal: handled like FAULT"
"""The comment row for a status no rank chooses: a rank killed by a signal (``128 + N``)."""
SCRIPT_CODES = ("DONE", "BUSY", "RETRY", "FAULT")
"""Codes the script's ``case`` names as ``EXIT_<NAME>`` variables (the in-job BAD_NODE arm has its own)."""


def exit_codes(cfg: RunConfig) -> str:
    """The comment rows of the exit-code contract, one per ``exitcodes.TABLE`` row (BAD_NODE only with
    in-job restarts: without them no rank ends with it), the signal row after FAULT."""
    rows = []
    for row in exitcodes.TABLE:
        if row.code == exitcodes.BAD_NODE and not ftlaunch.in_job(cfg):
            continue
        rows.append(f"#   {row.code:<2} {row.name:<11} {row.meaning:<63} -> {row.script}")
        if row.code == exitcodes.FAULT:
            rows.append(SIGNAL_ROW)
    return "\n".join(rows)


def exit_vars() -> str:
    """``EXIT_DONE=0 EXIT_BUSY=4 ...``: the shell names of ``SCRIPT_CODES``, values from ``exitcodes``."""
    return " ".join(f"EXIT_{name}={getattr(exitcodes, name)}" for name in SCRIPT_CODES)


def injob_notes(cfg: RunConfig) -> str:
    """The in-job part of the exit-code comment block (empty without in-job restarts)."""
    if not ftlaunch.in_job(cfg):
        return ""
    n = cfg.launcher.max_restarts
    return (
        f"# In-job restarts (launcher.max_restarts={n}): one NVRx ft_launcher per node starts the node's ranks\n"
        f"# and, when a rank dies or hangs, restarts every rank inside this allocation, at most {n} times\n"
        "# (each start runs the node health check first). Each rank records its code in $KILOCARD_EXIT_DIR\n"
        "# and exits non-zero only on FAULT; the run's code is `python -m kilocard.exitcodes EXIT_DIR RC`.\n"
        "# When the restarts are spent (FAULT) or the allocation is lost, the requeue below is the fallback;\n"
        f"# a requeued job, and the later links of a chain, keep the nodes of {BLOCKLIST} out (ExcNodeList).\n"
        "# Output lines are labelled by node (the launcher's srun task), a rank's lines also by rank (see the\n"
        "# training step below).\n"
    )


def injob_setup(cfg: RunConfig) -> str:
    """The in-job restarts' environment: the exit-code directory (per job and requeue) and ``rank_env``."""
    if not ftlaunch.in_job(cfg):
        return ""
    env = [f"export {name}={shell.quote('launcher.max_restarts', v)}" for name, v in ftlaunch.rank_env(cfg).items()]
    return "\n".join(
        [
            "# In-job restarts: each rank records its exit code here (one directory per job and requeue).",
            f'export {EXIT_DIR_ENV}="$RUN_DIR/logs/exit/$SLURM_JOB_ID.${{SLURM_RESTART_COUNT:-0}}"',
            f'mkdir -p "${EXIT_DIR_ENV}" || exit 1',
            *env,
            f"export {ftlaunch.LINE_PREFIX_ENV}={shell.quote(ftlaunch.LINE_PREFIX_ENV, ftlaunch.LINE_PREFIX)}",
            "",
        ]
    )


def injob_code(cfg: RunConfig, run_dir: Path, python: str) -> str:
    """After the launchers: the run's code from the ranks' records and the launcher's status."""
    if not ftlaunch.in_job(cfg):
        return ""
    helper = host_python(cfg, run_dir, python)
    return (
        'log "ft_launcher exit code $rc"\n'
        f'KILOCARD_LAUNCHER_RC=$rc\nrc=$({helper} -m kilocard.exitcodes "${EXIT_DIR_ENV}" "$KILOCARD_LAUNCHER_RC") '
        "|| rc=$KILOCARD_LAUNCHER_RC\n"
    )


def injob_functions(cfg: RunConfig) -> str:
    """``exclude_blocklisted`` keeps the blocklist's nodes out of a job that is pending again (this one after
    its requeue, or a later link of the chain); ``exclude_from_later_links`` applies it down the chain."""
    if not ftlaunch.in_job(cfg):
        return ""
    return f"""# Keep the nodes of the run's blocklist (kilocard/train/health.py) out of job $1 (default: this job,
# requeued); the job's own exclusions stay. The requeue's TERM may cut an scontrol call short: it is retried.
exclude_blocklisted() {{
  local KILOCARD_JOB=${{1:-$SLURM_JOB_ID}} KILOCARD_WHAT=${{2:-the requeued job}}
  [ -s "$RUN_DIR/{BLOCKLIST}" ] || return 0
  KILOCARD_EXCLUDE=$(timeout 10 scontrol show job "$KILOCARD_JOB" | sed -n 's/.*ExcNodeList=\\([^ ]*\\).*/\\1/p')
  KILOCARD_EXCLUDE=$( {{ cut -f1 "$RUN_DIR/{BLOCKLIST}"
    [ -z "$KILOCARD_EXCLUDE" ] || [ "$KILOCARD_EXCLUDE" = "(null)" ] || scontrol show hostnames "$KILOCARD_EXCLUDE"
  }} 2>/dev/null |
    grep -E '^[A-Za-z0-9._-]+$' | sort -u | paste -sd, -)
  for _ in 1 2 3; do
    if timeout 10 scontrol update "JobId=$KILOCARD_JOB" "ExcNodeList=$KILOCARD_EXCLUDE"; then
      log "excluding node(s) $KILOCARD_EXCLUDE from $KILOCARD_WHAT (blocklist $RUN_DIR/{BLOCKLIST})"
      return 0
    fi
    sleep 1
  done
  log "could not exclude node(s) $KILOCARD_EXCLUDE from $KILOCARD_WHAT (scontrol update failed); it may run on them"
  return 0
}}

# The later links of a chain are queued already, each pending on the one before (afterany): walk the
# chain from this job and keep the blocklist's nodes out of every link still to run.
exclude_from_later_links() {{
  local KILOCARD_PREV=$SLURM_JOB_ID KILOCARD_NEXT _
  [ -s "$RUN_DIR/{BLOCKLIST}" ] || return 0
  for _ in $(seq "$CHAIN_LENGTH"); do
    KILOCARD_NEXT=$(timeout 10 squeue -h -t PD -n "$SLURM_JOB_NAME" -o '%i %E' |
      awk -v KILOCARD_DEP="afterany:$KILOCARD_PREV" '{{ n = split($2, deps, ","); for (i = 1; i <= n; i++) {{
        sub(/\\(.*/, "", deps[i]); if (deps[i] == KILOCARD_DEP) {{ print $1; exit }} }} }}')
    [ -n "$KILOCARD_NEXT" ] || return 0
    exclude_blocklisted "$KILOCARD_NEXT" "chain link job $KILOCARD_NEXT"
    KILOCARD_PREV=$KILOCARD_NEXT
  done
}}

"""


def injob_case(cfg: RunConfig) -> str:
    """The BAD_NODE arm of the exit-code ``case``: requeue (``exclude_blocklisted`` keeps the nodes out)."""
    if not ftlaunch.in_job(cfg):
        return ""
    return (
        f'  "{exitcodes.BAD_NODE}")\n'
        "    # BAD_NODE: a node failed its health check and is in the blocklist (see the ranks' lines above)\n"
        "    continue_run ;;\n"
    )


def preflight_command(cfg: RunConfig, plan: LaunchPlan, run_dir: Path, python: str) -> str:
    """One task per node runs ``preflight.py`` (copied into the run dir) with the job's python."""
    low, below = mcore_range()
    args = [f"--nodes={plan.nodes}", f"--ntasks={plan.nodes}", "--ntasks-per-node=1", "--kill-on-bad-exit=0"]
    gpus = plan.gpus_per_node if plan.on_gpu else 0
    flags = [f"--gpus-per-node {gpus}", f"--mcore-min {low}", f"--mcore-below {below}"]
    if cfg.precision.fp8 or cfg.precision.fp4:
        flags.append("--need-te")
    if ftlaunch.in_job(cfg):
        flags.append("--need-nvrx")
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
        "# derived from the job id (+ restart count: a requeued job gets a fresh port); 20000-31999 stays\n"
        "# below the kernel's ephemeral ports (32768 up), which any outgoing connection on the node may hold\n"
        "export MASTER_PORT=$(( 20000 + (SLURM_JOB_ID * 7 + ${SLURM_RESTART_COUNT:-0}) % 12000 ))"
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
        "train_command": train_command(cfg, plan, python),
        "label_note": label_note(cfg),
        "exit_codes": exit_codes(cfg),
        "exit_vars": exit_vars(),
        "injob_notes": injob_notes(cfg),
        "injob_setup": injob_setup(cfg),
        "injob_code": injob_code(cfg, run_dir, python),
        "injob_functions": injob_functions(cfg),
        "after_requeue": "exclude_blocklisted && " if ftlaunch.in_job(cfg) else "",
        "before_next_link": "exclude_from_later_links; " if ftlaunch.in_job(cfg) else "",
        "injob_case": injob_case(cfg),
    }
    return fill(read_text(data_dir("slurm") / TEMPLATE), values)
