"""``kilocard.api``, the public Python API: typed, small, and light to import."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.integration  # a fresh interpreter: what `import kilocard` loads
def test_import_is_light() -> None:
    """``import kilocard`` and ``kilocard.api`` import no torch or Megatron-Core (a fresh interpreter)."""
    code = (
        "import sys, kilocard, kilocard.api\n"
        "heavy = sorted(m for m in ('torch', 'megatron', 'transformer_engine') if m in sys.modules)\n"
        "print(','.join(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == ""


def test_compose_validate_predict() -> None:
    from kilocard.api import ComposeError, Layout, Report, RunConfig, compose, predict, validate

    cfg = compose("recipe=tiny_gpt", "cluster.gpus_per_node=2", "parallel.tensor_model_parallel_size=2")
    assert isinstance(cfg, RunConfig) and cfg.parallel.tensor_model_parallel_size == 2
    report = validate(cfg)
    assert isinstance(report, Report) and isinstance(report.layout, Layout)
    assert report.valid and (report.layout.tp, report.layout.dp) == (2, 1)
    bad = validate(compose("recipe=tiny_gpt", "parallel.tensor_model_parallel_size=3"))
    assert not bad.valid and "WORLD_NOT_DIVISIBLE" in bad.codes()
    assert predict(cfg).step_time_s > 0
    with pytest.raises(ComposeError, match="trainer.globl_batch_size"):
        compose("trainer.globl_batch_size=1")
    with pytest.raises(TypeError, match="separate strings"):
        compose(["recipe=tiny_gpt"])  # type: ignore[arg-type]


def test_load_run_config_reads_a_frozen_config(tmp_path) -> None:
    from omegaconf import OmegaConf

    from kilocard.api import compose, load_run_config

    cfg = compose("recipe=tiny_gpt", "trainer.train_iters=7")
    (tmp_path / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.structured(cfg)))
    assert load_run_config(tmp_path / "config.yaml").trainer.train_iters == 7
    assert load_run_config(str(tmp_path / "config.yaml")).trainer.train_iters == 7
