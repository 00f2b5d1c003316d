"""``trainer.profile_steps=[a,b]``: a torch profiler trace of steps a..b, one Chrome trace per rank.

Every rank records its CPU activity (and CUDA kernels on GPU ranks) from the start of step ``a`` to
the end of step ``b`` and writes ``<run_dir>/profile/rank_<R>_steps_<a>-<b>.json`` (open it in
Perfetto or ``chrome://tracing``). A resumed run inside the window traces from its first step; a
run that stops inside the window writes what it recorded. On GPU ranks the window is also the CUDA
profiler range, which is what Nsight Systems captures when the batch script wraps the ranks with
``nsys`` (``trainer.nsys``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

PROFILE_DIR = "profile"
"""Folder of the traces inside the run directory."""


class StepProfiler:
    """Starts and stops torch's profiler around a window of steps on one rank."""

    def __init__(
        self, run_dir: Path, steps: list[int], rank: int, cuda: bool, log: Callable[[str], None] = print
    ) -> None:
        self.window = (steps[0], steps[1]) if steps else None
        """(first, last) step traced; ``None`` when profiling is off."""
        self.path = run_dir / PROFILE_DIR / f"rank_{rank}_steps_{steps[0]}-{steps[1]}.json" if steps else None
        """Where the trace goes."""
        self._cuda = cuda
        self._log = log
        """Says where the trace went (the trainer's rank-0 log line)."""
        self._prof: Any = None

    def before_step(self, step: int) -> None:
        """Called before step ``step`` runs: start tracing when it is inside the window."""
        if self.window is None or self._prof is not None or not self.window[0] <= step <= self.window[1]:
            return
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self._cuda else [])
        self._prof = profile(activities=activities, record_shapes=True)
        self._prof.__enter__()
        self._cuda_range(start=True)

    def after_step(self, step: int) -> None:
        """Called after step ``step``: write the trace once the window's last step is done."""
        if self._prof is not None and self.window is not None and step >= self.window[1]:
            self.finish()

    def _cuda_range(self, start: bool) -> None:
        """Open or close the CUDA profiler range on GPU ranks: what ``nsys --capture-range=cudaProfilerApi``
        (``trainer.nsys``) records; a no-op without nsys attached."""
        if not self._cuda:
            return
        import torch

        (torch.cuda.cudart().cudaProfilerStart if start else torch.cuda.cudart().cudaProfilerStop)()

    def finish(self) -> None:
        """Stop tracing (if on) and write the trace."""
        if self._prof is None or self.path is None:
            return
        prof, self._prof = self._prof, None
        self._cuda_range(start=False)
        prof.__exit__(None, None, None)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(self.path))
        first, last = self.window if self.window else (0, 0)
        self._log(f"profiler: trace of steps {first}-{last} written to {self.path} (each rank writes its own there)")
