"""Processes that never outlive their parent: the kernel's parent-death signal (Linux ``prctl``).

``kilocard run`` starts torchrun (or NVRx's ``ft_launcher``) with ``parent_death_preexec`` and every rank
calls ``die_with_parent`` first thing, so a ``kill -9`` of the launcher takes the whole tree with it:
torchrun gets SIGKILL when the launcher dies, each rank when its launcher dies. Processes forked without
an ``exec`` (Megatron-Core's checkpoint writers, NVRx's rank monitors) are tied to their parent by
``die_with_parent_in_forks``. Elsewhere (not Linux)
both are no-ops that say so by returning ``False``.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Callable

PR_SET_PDEATHSIG = 1
"""prctl(2) option: the signal a process gets when the thread that forked it exits (Linux)."""
ORPHANED_EXIT = 76
"""Exit status of a process whose parent died before the guard was set (``kilocard.exitcodes.FAULT``)."""


def set_parent_death_signal(sig: int = signal.SIGKILL) -> bool:
    """Ask the kernel to send ``sig`` to this process when its parent dies; whether it is set (Linux only)."""
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0


def die_with_parent(parent: int, sig: int = signal.SIGKILL) -> bool:
    """``set_parent_death_signal``, then exit at once when ``parent`` is already gone (it died before the
    guard was set: the process now belongs to init or a subreaper). Whether the guard is set."""
    armed = set_parent_death_signal(sig)
    if armed and os.getppid() != parent:
        os._exit(ORPHANED_EXIT)
    return armed


def parent_death_preexec(sig: int = signal.SIGKILL) -> Callable[[], None]:
    """A ``subprocess.Popen(preexec_fn=...)`` that ties the child to the process starting it (the signal
    survives the child's ``exec``)."""
    parent = os.getpid()

    def _preexec() -> None:
        die_with_parent(parent, sig)

    return _preexec


def die_with_parent_in_forks() -> bool:
    """Make every child this process forks from now on get SIGKILL when its parent dies (Linux).

    Megatron-Core's checkpoint writer (``FileSystemWriterAsync``) forks worker processes that
    inherit the rank's gloo/NCCL sockets. If the rank is killed mid-save, orphaned workers can
    outlive it (seen here: stuck for minutes in a multiprocessing queue), keep those sockets open,
    and leave the other ranks waiting in a collective instead of failing fast with FAULT; NVRx's
    ``ft_launcher`` forks its rank monitors the same way. ``os.register_at_fork`` covers ``os.fork``
    and multiprocessing's fork start method, not ``subprocess`` (which execs); the signal follows the
    forking *thread*, and both fork from the main thread. Returns whether the guard is installed.
    """
    if not sys.platform.startswith("linux"):
        return False
    forking = [os.getpid()]

    def _before() -> None:
        forking[0] = os.getpid()

    def _in_child() -> None:
        die_with_parent(forking[0])

    os.register_at_fork(before=_before, after_in_child=_in_child)
    return True
