"""Heartbeats to NVRx's rank monitor under ``ft_launcher``: a hung rank is found in seconds, not minutes.

Only when ``FT_RANK_MONITOR_IPC_SOCKET`` is set (the rank was started by ``ft_launcher``) does
``start`` return a ``Heartbeat``: a ``Watchdog`` whose every ``beat`` (each step, and each long phase:
model build, checkpoint search and load, data iterator, save) also sends a heartbeat to this rank's
monitor. A rank whose heartbeats stop for longer than the timeout is killed by its monitor, and
``ft_launcher`` restarts every rank (``kilocard.launch.ftlaunch``).

Timeouts: until calibrated, both are the launcher's start-up allowance (``trainer.hang_timeout_s``).
At the first step after each save (so that a save is among the intervals measured), the ranks call
NVRx's ``calculate_and_set_hb_timeouts`` (a collective: every rank beats the same steps):
``subsequent`` = ``safety_factor`` (NVRx's, 5) x the longest interval between two heartbeats, the
maximum over the ranks, merged half and half with the previous calibrated value; kilocard then raises
it to at least ``MIN_TIMEOUT_S`` (noise on shared CPUs is not a hang) and keeps ``initial`` (up to the
first heartbeat of an attempt: imports, rendezvous) at the start-up allowance. The calibrated timeouts
(the client's ``state_dict``, the same on every rank) are kept in ``<run_dir>/HEARTBEAT_FILE``, so a
restarted attempt starts calibrated. The own watchdog keeps running beside it with
``trainer.hang_timeout_s`` (and alone for runs without ``ft_launcher``).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kilocard.base.safe_read import FileReadError, read_json
from kilocard.base.say import say
from kilocard.train.signals import Watchdog

SOCKET_ENV = "FT_RANK_MONITOR_IPC_SOCKET"
"""Set by ``ft_launcher`` for every rank: where its rank monitor listens."""
HEARTBEAT_FILE = "heartbeat.json"
"""The calibrated heartbeat timeouts (``RankMonitorClient.state_dict()``), in the run directory."""
MIN_TIMEOUT_S = 10.0
"""The shortest heartbeat timeout kilocard sets: a busy shared CPU can stall a rank for seconds."""


class Heartbeat(Watchdog):
    """The watchdog that also sends NVRx heartbeats and calibrates their timeouts (see the module docstring)."""

    def __init__(self, timeout_s: float, rank: int, client: Any, state_file: Path) -> None:
        super().__init__(timeout_s, rank)
        self.client = client
        """NVRx's ``RankMonitorClient``, monitoring initialised."""
        self.state_file = state_file
        """Where rank 0 keeps the calibrated timeouts."""
        self._saved = False
        """A save began since the last calibration: the next step calibrates."""
        self.client_error: type[Exception] = _client_error()
        """NVRx's ``RankMonitorClientError``: a heartbeat that could not reach the rank monitor."""

    def beat(self, where: str) -> None:
        """Record progress, send a heartbeat; at the first step after a save, calibrate (collective)."""
        super().beat(where)
        if self.client is None:
            return
        try:
            self.client.send_heartbeat()
        except self.client_error as e:
            self.monitor_lost(e)
            return
        if where.startswith("saving "):
            self._saved = True
        elif where.startswith("step ") and self._saved:
            self._saved = False
            self.calibrate()

    def monitor_lost(self, error: Exception) -> None:
        """The rank monitor went away (Slurm's ``--signal=USR1`` reaches it too, and NVRx's monitor ends on
        USR1): training goes on, the own watchdog still guards against hangs, and ft_launcher still
        restarts a rank that dies. Said once."""
        self.client = None
        _say(f"rank monitor gone ({str(error)[:120]}); hang detection continues with the watchdog")

    def calibrate(self) -> None:
        """Set the heartbeat timeouts from the measured intervals (every rank at once) and keep them."""
        import torch.distributed as dist

        if not self.client.calculate_and_set_hb_timeouts(skip_if_not_ready=True):
            return
        startup_s = self.client.cfg.initial_rank_heartbeat_timeout  # as the launcher set it
        self.client.load_state_dict(bounded(self.client.state_dict(), startup_s))
        if dist.get_rank() == 0:
            tmp = self.state_file.with_suffix(".tmp")
            tmp.write_text(json.dumps(self.client.state_dict()) + "\n")
            os.replace(tmp, self.state_file)
            _say(f"heartbeat timeouts calibrated: {describe(self.client.state_dict())}")

    def stop(self) -> None:
        """Stop watching and leave the rank monitor (the rank ends on purpose)."""
        super().stop()
        if self.client is not None:
            self.client.shutdown_workload_monitoring()


def bounded(state: Mapping[str, Any], startup_s: float) -> dict[str, Any]:
    """``state`` (a ``RankMonitorClient.state_dict()``) with the ``initial`` timeout at the start-up allowance
    ``startup_s`` and the ``subsequent`` one at least ``MIN_TIMEOUT_S``."""
    out = json.loads(json.dumps(state))
    hb = out.get("current_timeouts", {}).get("heartbeat")
    if hb:
        hb["initial"] = startup_s
        hb["subsequent"] = max(float(hb["subsequent"]), MIN_TIMEOUT_S)
    return out


def describe(state: Mapping[str, Any]) -> str:
    """``initial Ns, subsequent Ms`` of a ``RankMonitorClient.state_dict()`` (``uncalibrated`` when it has none)."""
    hb = state.get("current_timeouts", {}).get("heartbeat")
    return f"initial {hb['initial']:.1f}s, subsequent {hb['subsequent']:.1f}s" if hb else "uncalibrated"


def _say(msg: str) -> None:
    say(f"kilocard.train: {msg}", sys.stderr)


def load_state(state_file: Path) -> dict[str, Any] | None:
    """The calibrated timeouts an earlier attempt kept, or ``None`` (none yet, or a torn file)."""
    try:
        state = read_json(state_file, dict, limit=1 << 20)
    except FileReadError:
        return None
    return state if isinstance(state, dict) else None


def _client_error() -> type[Exception]:
    from nvidia_resiliency_ext.fault_tolerance.rank_monitor_client import RankMonitorClientError

    return RankMonitorClientError


def start(timeout_s: float, rank: int, run_dir: Path, env: Mapping[str, str]) -> Watchdog:
    """This rank's progress guard, started: a ``Heartbeat`` under ``ft_launcher``, else the plain ``Watchdog``."""
    if not env.get(SOCKET_ENV):
        return Watchdog(timeout_s, rank).start()
    from nvidia_resiliency_ext.fault_tolerance import RankMonitorClient

    client = RankMonitorClient()
    state_file = Path(run_dir) / HEARTBEAT_FILE
    kept = load_state(state_file)
    if kept is not None:
        client.load_state_dict(kept)
        if rank == 0:
            _say(f"heartbeat timeouts kept from an earlier attempt: {describe(kept)}")
    client.init_workload_monitoring()
    return Heartbeat(timeout_s, rank, client, state_file).start()
