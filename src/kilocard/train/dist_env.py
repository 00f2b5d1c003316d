"""The rank's torch.distributed environment: torchrun's variables, Slurm's, or a single process."""

from __future__ import annotations

import socket
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass


@dataclass(frozen=True)
class RankEnv:
    """Where this process sits in the job."""

    rank: int
    """Global rank."""
    world_size: int
    """Ranks in the job."""
    local_rank: int
    """Rank on this node (selects the GPU)."""


def free_port() -> int:
    """A TCP port free on this host right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def resolve(env: MutableMapping[str, str]) -> RankEnv:
    """Fill RANK/WORLD_SIZE/LOCAL_RANK (+ MASTER_ADDR/PORT) in ``env`` from torchrun, Slurm or defaults.

    torchrun's variables win; otherwise Slurm's ``SLURM_PROCID``/``SLURM_NTASKS``/``SLURM_LOCALID``
    (the batch script must export MASTER_ADDR/MASTER_PORT); otherwise a single local process.
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
        env.setdefault("MASTER_ADDR", "127.0.0.1")
        env.setdefault("MASTER_PORT", str(free_port()))
    env.setdefault("LOCAL_RANK", "0")
    return RankEnv(rank=_int(env, "RANK"), world_size=_int(env, "WORLD_SIZE"), local_rank=_int(env, "LOCAL_RANK"))


def _int(env: Mapping[str, str], key: str) -> int:
    try:
        return int(env[key])
    except (KeyError, ValueError):
        raise ValueError(f"{key}={env.get(key)!r}: expected an integer") from None
