"""The NVRx fault-tolerance launcher (``ft_launcher``) for in-job restarts: one argument list, for
``kilocard run`` and for the batch script alike.

With ``launcher.max_restarts`` > 0 the ranks are started by NVIDIA Resiliency Extension's
``ft_launcher`` (torchrun-compatible) instead of torchrun or a bare ``srun``: when a rank dies or
stops sending heartbeats, it stops every rank and starts them again inside the same allocation, at
most ``max_restarts`` times, each attempt with a fresh rendezvous store (no stale gloo addresses).
The ranks resume from the newest usable checkpoint. The heartbeat timeout starts at
``trainer.hang_timeout_s`` (a start-up allowance: model build and checkpoint load) and the ranks
narrow it once they have measured their step time (``kilocard.train.heartbeat``).
"""

from __future__ import annotations

import importlib.util
import math
import re
import sys
from importlib import metadata

from kilocard import exitcodes
from kilocard.config.schema import RunConfig

MODULE = "nvidia_resiliency_ext.fault_tolerance.launcher"
"""``python -m MODULE`` is ``ft_launcher`` (the console script may not be on a node's PATH)."""
TIED_MODULE = "kilocard.launch.ftlaunch"
"""``python -m TIED_MODULE ARGS`` is ``ft_launcher ARGS`` whose forked rank monitors die with it (``kilocard
run``: started with the parent-death signal, its whole tree goes when the launcher is killed)."""
CHECK_INTERVAL_S = 1.0
"""How often the launcher's rank monitors check the heartbeats (NVRx default 5 s): detection in seconds."""
WORKERS_STOP_TIMEOUT_S = 15.0
"""Seconds the launcher gives the surviving ranks to exit after a fault before it SIGKILLs them."""
TEE = "--tee=3"
"""``ft_launcher`` option (batch script): each rank's stdout and stderr go to a file that the launcher copies to
its own output, every line prefixed with ``LINE_PREFIX``. Under one launcher per node, ``srun --label`` names
the node only (and the rendezvous, not Slurm, decides which ranks a node runs)."""
LINE_PREFIX_ENV = "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"
"""Environment variable the launcher reads its per-rank line prefix from (torchrun's)."""
LINE_PREFIX = "[rank${rank}]: "
"""The prefix of each teed line (``${rank}``: the rank's global rank); ``kilocard logs --rank`` matches it."""


def available() -> bool:
    """Whether NVRx (the ``resiliency`` extra) is importable here."""
    try:
        return importlib.util.find_spec(MODULE) is not None
    except ModuleNotFoundError:
        return False


NVRX_MIN_FOR_MCORE = ((0, 19), (0, 6, 0))
"""megatron-core from this version on asserts at import that an installed NVRx is at least that one
(``dist_checkpointing/strategies/nvrx.py``: ``NVRX_MIN_VERSION``); NVRx 0.6.0 needs Python >= 3.12."""
NVRX_MIN_PYTHON = (3, 12)


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", text.split("+")[0])[:3])


def _installed(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def restart_support(mcore: str | None, nvrx: str | None, python: tuple[int, int]) -> str | None:
    """Why in-job restarts cannot run with these megatron-core and NVRx versions on this Python, or ``None``
    (NVRx missing altogether is ``available``'s case).

    What works, per megatron-core version: 0.16.1-0.18.x with NVRx 0.4.1 (the ``resiliency`` extra on
    Python 3.11, where 0.16.1 is the newest megatron-core); 0.19.x only with NVRx >= 0.6.0, which needs
    Python >= 3.12 (the extra asks for it there).
    """
    fix = "or set launcher.max_restarts=0"
    low_mcore, need = NVRX_MIN_FOR_MCORE
    needed = ".".join(map(str, need))
    new_mcore = mcore is not None and _version(mcore)[:2] >= low_mcore
    if new_mcore and python < NVRX_MIN_PYTHON:
        return (
            f"launcher.max_restarts: in-job restarts on megatron-core {mcore} need nvidia-resiliency-ext >= {needed}, "
            f"which needs Python >= {'.'.join(map(str, NVRX_MIN_PYTHON))} (this is {python[0]}.{python[1]}): use "
            f"megatron-core 0.16.1-0.18.x with pip install 'kilocard[resiliency]', {fix}"
        )
    if nvrx is not None and new_mcore and _version(nvrx) < need:
        return (
            f"launcher.max_restarts: nvidia-resiliency-ext {nvrx} is installed, megatron-core {mcore} needs >= "
            f"{needed}; pip install 'nvidia-resiliency-ext>={needed}', {fix}"
        )
    return None


def installed_restart_support() -> str | None:
    """``restart_support`` of this Python's megatron-core and NVRx."""
    return restart_support(
        _installed("megatron-core"),
        _installed("nvidia-resiliency-ext"),
        tuple(sys.version_info[:2]),  # type: ignore[arg-type]
    )


def in_job(cfg: RunConfig) -> bool:
    """Whether this run restarts its ranks inside the allocation (``launcher.max_restarts`` > 0)."""
    return cfg.launcher.max_restarts > 0


def ft_launcher_args(
    cfg: RunConfig, *, nnodes: str, nproc: int, rdzv_endpoint: str, term_timeout_s: float | None = None
) -> list[str]:
    """``ft_launcher``'s options (after ``python -m MODULE``) for ``nproc`` ranks per node on ``nnodes``
    nodes (a number, or a shell expression such as ``$SLURM_NNODES`` for the batch script), up to the
    module to run; the caller appends ``-m kilocard.train RUN_DIR``. ``term_timeout_s``: how long the
    ranks may take to save and stop after a TERM to the launcher, which passes it on to them (NVRx's
    default when ``None``: 1800 s)."""
    first_hb = max(math.ceil(cfg.trainer.hang_timeout_s), 1) if cfg.trainer.hang_timeout_s > 0 else 3600
    term = [] if term_timeout_s is None else [f"--term-timeout={math.ceil(term_timeout_s)}"]
    return [
        f"--nnodes={nnodes}",
        f"--nproc-per-node={nproc}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={rdzv_endpoint}",
        f"--max-restarts={cfg.launcher.max_restarts}",
        f"--workers-stop-timeout={WORKERS_STOP_TIMEOUT_S:g}",
        f"--ft-initial-rank-heartbeat-timeout={first_hb}",
        f"--ft-rank-heartbeat-timeout={first_hb}",
        f"--ft-workload-check-interval={CHECK_INTERVAL_S:g}",
        "--ft-enable-nic-monitor=false",
        *term,
    ]


def rank_env(cfg: RunConfig) -> dict[str, str]:
    """What the ranks under ``ft_launcher`` must see: only a fault exits non-zero (``kilocard.exitcodes``)."""
    return {exitcodes.INJOB_ENV: str(cfg.launcher.max_restarts)}


def tied_main() -> None:
    """Run ``ft_launcher`` (``MODULE``) in this process with every fork tied to it (``TIED_MODULE``)."""
    from kilocard.base.lifeline import die_with_parent_in_forks
    from kilocard.base.quickexit import run_module

    die_with_parent_in_forks()
    run_module(MODULE)  # and ends without the interpreter's teardown of the torch it imported


if __name__ == "__main__":
    tied_main()
