"""What the validator estimates for a config, as a typed object (``Report.estimates``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kilocard.perf.flops import CURRENT
from kilocard.perf.memory import MemoryEstimate
from kilocard.perf.predict import Prediction

FLOPS_CONVENTION = CURRENT
"""The FLOPs convention of ``flops_per_iteration``."""


@dataclass(frozen=True)
class Estimates:
    """Memory per GPU against HBM, FLOPs per iteration and (for a valid config) the predicted step time."""

    memory: MemoryEstimate | None = None
    """Bytes per GPU by component on the most loaded stage; ``None`` when the model shape is invalid."""
    hbm_bytes: int | None = None
    """Memory per GPU (cluster.hbm_bytes or the GPU table's); ``None`` when unknown."""
    hbm_usable_bytes: int | None = None
    """HBM less the reserve the memory rule keeps for the allocator and workspaces."""
    flops_per_iteration: float | None = None
    """FLOPs of one optimizer step under ``flops_convention``; ``None`` when the shape is invalid."""
    flops_convention: str = FLOPS_CONVENTION
    """The FLOPs convention."""
    prediction: Prediction | None = None
    """Step time and MFU; only for a config without errors."""

    def to_json(self) -> dict[str, Any]:
        """The ``estimates`` object of ``kilocard validate --format json`` (the contract docs/validate.md states)."""
        out: dict[str, Any] = {
            "memory_bytes_per_gpu": self.memory.to_json() if self.memory is not None else None,
            "hbm_bytes": self.hbm_bytes,
            "hbm_usable_bytes": self.hbm_usable_bytes,
            "flops_per_iteration": self.flops_per_iteration,
            "flops_convention": self.flops_convention,
        }
        if self.memory is not None:
            out["params_per_gpu"] = self.memory.params_on_stage
        if self.prediction is not None:
            out["prediction"] = self.prediction.to_json()
        return out
