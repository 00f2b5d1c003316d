"""The rank's torch.distributed environment: torchrun's variables, Slurm's, or a single process; the process group.

Under a restarting launcher (torchrun ``--max-restarts``, NVRx ``ft_launcher``) every attempt's ranks
meet in a store key space of their own (``attempt_store``): with torchrun's shared store and no
per-attempt prefix, restarted gloo ranks read a dead peer's old address and fail to connect or hang
in the process group's constructor (the stale-address trap, measured in the resiliency notes).
NVRx's ``ft_launcher`` (0.4) gives every attempt a fresh store on a new port instead, and there the
ranks must not add a prefix of their own: each node's launcher counts only the restarts it paid for, so
after a restart for a membership change (one node's launcher re-entered the rendezvous while the
other's ranks still ran) the nodes' ``TORCHELASTIC_RESTART_COUNT`` differ, and ranks that prefixed
their keys with it would wait for each other in two key spaces until the hang watchdog.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any

from kilocard.rundir.names import STEP_DELAY_ENV


@dataclass(frozen=True)
class RankEnv:
    """Where this process sits in the job."""

    rank: int
    """Global rank."""
    world_size: int
    """Ranks in the job."""
    local_rank: int
    """Rank on this node (selects the GPU)."""


def resolve(env: MutableMapping[str, str]) -> RankEnv:
    """Fill RANK/WORLD_SIZE/LOCAL_RANK in ``env`` from torchrun, Slurm or defaults.

    torchrun's variables win; otherwise Slurm's ``SLURM_PROCID``/``SLURM_NTASKS``/``SLURM_LOCALID``
    (the batch script must export MASTER_ADDR/MASTER_PORT); otherwise a single local process, which meets
    no other rank: ``init_process_group`` gives it an in-memory store and it binds no port (``alone``).
    """
    if "RANK" not in env and "SLURM_PROCID" in env:
        env["RANK"] = env["SLURM_PROCID"]
        env["WORLD_SIZE"] = env.get("SLURM_NTASKS", "1")
        env["LOCAL_RANK"] = env.get("SLURM_LOCALID", "0")
        for key in ("MASTER_ADDR", "MASTER_PORT"):
            if key not in env:
                raise ValueError(f"{key}: not set; the Slurm batch script must export it for every rank")
    if "RANK" not in env:
        env.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    env.setdefault("LOCAL_RANK", "0")
    return RankEnv(rank=_int(env, "RANK"), world_size=_int(env, "WORLD_SIZE"), local_rank=_int(env, "LOCAL_RANK"))


def _int(env: Mapping[str, str], key: str) -> int:
    try:
        return int(env[key])
    except (KeyError, ValueError):
        raise ValueError(f"{key}={env.get(key)!r}: expected an integer") from None


MAX_STEP_DELAY_S = 3600.0
"""The longest step delay ``step_delay`` accepts (an hour: longer is a typo, not a test)."""


def step_delay(env: Mapping[str, str]) -> float:
    """Seconds to sleep before each step (``names.STEP_DELAY_ENV``, fault injection; 0 when unset)."""
    raw = env.get(STEP_DELAY_ENV, "").strip()
    try:
        value = float(raw or 0)
    except ValueError:
        value = -1.0  # refused below, with the raw text
    if not (0 <= value <= MAX_STEP_DELAY_S):
        raise ValueError(f"{STEP_DELAY_ENV}={raw!r}: expected seconds from 0 to {MAX_STEP_DELAY_S:g}; unset it")
    return value


RESTART_ENV = "TORCHELASTIC_RESTART_COUNT"
"""Set by torchrun and ft_launcher: which attempt of the ranks this is (0 first)."""


def attempt_store(env: Mapping[str, str], timeout: datetime.timedelta) -> Any | None:
    """The store this attempt's process group meets in, or ``None`` for torch's default (``env://``).

    Under a restarting launcher (``RESTART_ENV`` set): the TCPStore at ``MASTER_ADDR:MASTER_PORT``. When the
    launcher's agent hosts it for every attempt (``TORCHELASTIC_USE_AGENT_STORE``: torchrun), it is wrapped
    in ``PrefixStore("attempt<N>")`` so no key of an earlier attempt is ever read; otherwise rank 0 hosts a
    store that is this attempt's alone (``ft_launcher``), used as it is (see the module docstring).
    """
    if RESTART_ENV not in env:
        return None
    import torch.distributed as dist

    rank, world = _int(env, "RANK"), _int(env, "WORLD_SIZE")
    hosted_by_agent = env.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    base = dist.TCPStore(
        env["MASTER_ADDR"],
        _int(env, "MASTER_PORT"),
        world,
        is_master=rank == 0 and not hosted_by_agent,
        timeout=timeout,
        multi_tenant=True,
    )
    if not hosted_by_agent:
        return base  # fresh for this attempt: the nodes' restart counts may differ, their keys must not
    return dist.PrefixStore(f"attempt{env[RESTART_ENV]}", base)


def alone(env: Mapping[str, str]) -> bool:
    """Whether this is the job's only rank with no launcher store to meet in (``MASTER_PORT`` unset)."""
    return _int(env, "WORLD_SIZE") == 1 and "MASTER_PORT" not in env


def init_process_group(backend: str, env: Mapping[str, str], timeout: datetime.timedelta) -> None:
    """``torch.distributed.init_process_group`` for this rank, in this attempt's own store (``attempt_store``)."""
    import torch.distributed as dist

    store = attempt_store(env, timeout)
    if store is None and alone(env):
        store = dist.HashStore()  # a port picked and bound later can be taken by then: a lone rank needs none
    if store is None:
        dist.init_process_group(backend, timeout=timeout)
    else:
        dist.init_process_group(
            backend, store=store, rank=_int(env, "RANK"), world_size=_int(env, "WORLD_SIZE"), timeout=timeout
        )
