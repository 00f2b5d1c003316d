"""kilocard's public Python API: compose a typed config, validate it, predict its speed.

Shown working by ``tests/docs/test_docs_commands.py``, which runs the README's snippet::

    from kilocard.api import compose, predict, validate
    cfg = compose("recipe=llama3_70b", "trainer.global_batch_size=1024")
    report = validate(cfg)
    predict(cfg).tflops_per_gpu

It imports no torch or Megatron-Core (Hydra and OmegaConf only, for composition). It is its own module,
not names on ``kilocard`` itself, because ``kilocard.validate`` is the validator's package.

Bad input raises ``ComposeError`` (one line naming the field, the value and the fix), never a
Hydra or OmegaConf exception.
"""

from __future__ import annotations

from pathlib import Path

from kilocard.config import ComposeError, RunConfig
from kilocard.config import compose as _compose_dict
from kilocard.config import load_run_config as _load_run_config
from kilocard.config.compose import to_run_config
from kilocard.layout import Layout
from kilocard.perf.predict import Prediction
from kilocard.perf.predict import predict as _predict
from kilocard.validate import Issue, Report
from kilocard.validate import validate as _validate


def compose(*overrides: str) -> RunConfig:
    """The typed config of a recipe plus Hydra overrides, as ``kilocard show`` composes it.

    ``compose("recipe=llama3_70b", "cluster.nodes=16")``; no override gives the schema's defaults
    (the ``tiny_gpt`` shape on ``local_cpu``). Raises ``ComposeError`` on a config that does not compose.
    """
    if any(not isinstance(o, str) for o in overrides):
        raise TypeError("kilocard.compose takes overrides as separate strings: compose('recipe=x', 'a.b=1')")
    return to_run_config(_compose_dict(list(overrides)))


def validate(cfg: RunConfig) -> Report:
    """Every problem of ``cfg`` at once, with its layout and estimates (pure: no environment, no I/O;
    the checks that read files, such as data prefixes and tokenizers, run in the CLI verbs only)."""
    return _validate(cfg)


def predict(cfg: RunConfig, convention: str = "megatron_current") -> Prediction:
    """Predicted step time, TFLOP/s per GPU and MFU of ``cfg`` on its cluster, FLOPs counted by
    ``convention`` (``megatron_current``, ``megatron_legacy``, ``megatron_sc21`` or ``six_n``)."""
    return _predict(cfg, convention)


def load_run_config(path: str | Path) -> RunConfig:
    """The frozen config of a run directory (``RUN_DIR/config.yaml``), typed."""
    return _load_run_config(Path(path))


__all__ = [
    "ComposeError",
    "Issue",
    "Layout",
    "Prediction",
    "Report",
    "RunConfig",
    "compose",
    "load_run_config",
    "predict",
    "validate",
]
