"""The output layer's cross-entropy: HBM bytes per logit of each Megatron-Core path, and which path a row ran."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from kilocard.calibration.baselines import load_rows, row_run_config
from kilocard.config.schema import ModelConfig, RunConfig
from kilocard.perf.predict import features_of, predict
from kilocard.perf.steptime import CROSS_ENTROPY_BYTES, cross_entropy_bytes

HELPER = Path(__file__).resolve().parents[1] / "cross_entropy_traffic.py"


def _with_cross_entropy(cfg: RunConfig, fusion: bool, impl: str = "native") -> RunConfig:
    model: ModelConfig = replace(cfg.model, cross_entropy_loss_fusion=fusion, cross_entropy_fusion_impl=impl)
    return replace(cfg, model=model)


@pytest.mark.integration  # measures Megatron-Core's cross entropy in a fresh interpreter
def test_unfused_bytes_are_what_megatron_core_moves() -> None:
    """The eager path (``cross_entropy_loss_fusion`` off), run from the megatron-core wheel under a
    dispatch mode that adds up each kernel's reads and writes (``tests/cross_entropy_traffic.py``, in its
    own process for its process group): 52 bytes per logit, not the 3 fp32 passes (12) once charged."""
    out = subprocess.run(
        [sys.executable, str(HELPER)], capture_output=True, text=True, timeout=300, check=True
    ).stdout.split()
    assert float(out[-1]) == pytest.approx(CROSS_ENTROPY_BYTES["unfused"], rel=0.02)


def test_fused_paths_move_fewer_bytes_than_the_eager_one() -> None:
    assert CROSS_ENTROPY_BYTES["te"] < CROSS_ENTROPY_BYTES["native"] < CROSS_ENTROPY_BYTES["unfused"]


def test_a_256k_vocab_row_pays_its_own_paths_bytes_on_the_last_stage() -> None:
    """NeMo 24.07 Nemotron 8B (vocab 256,000, TP 2, MBS 4, seq 4096): its launcher config fuses the
    cross-entropy (native); the logits time of each path differs by exactly its bytes per logit at HBM
    bandwidth, for every micro-batch of the step."""
    row = next(r for r in load_rows() if r.id == "nemo2407-h100-nemotron-8b-fp8")
    cfg = row_run_config(row)
    assert features_of(cfg).cross_entropy == "native"
    unfused = predict(_with_cross_entropy(cfg, False)).breakdown["logits"]
    native = predict(cfg).breakdown["logits"]
    te = predict(_with_cross_entropy(cfg, True, "te")).breakdown["logits"]
    per_byte = (unfused - native) / (CROSS_ENTROPY_BYTES["unfused"] - CROSS_ENTROPY_BYTES["native"])
    assert per_byte > 0
    assert native - te == pytest.approx(per_byte * (CROSS_ENTROPY_BYTES["native"] - CROSS_ENTROPY_BYTES["te"]))


@pytest.mark.parametrize(
    ("row_id", "path"),
    [
        ("nemo2407-h100-nemotron-22b-fp8", "native"),  # NeMo-Framework-Launcher 24.07 nemotron_22b.yaml
        ("dgxc2501-nemotron4-15b-bf16-16", "native"),  # dgxc-benchmarking 143b90d nemotron4-15b-synth.yaml
        ("nemo2407-h100-gpt3-5b-fp8", "unfused"),  # gpt3/5b.yaml leaves Megatron-Core's default
        ("bridge2511-h100-llama3-70b-fp8", "te"),  # Megatron-Bridge perf overrides: cross_entropy_fusion_impl te
        ("sc21-1.7b", "unfused"),  # 2021 Megatron-LM had only the eager path
    ],
)
def test_each_row_runs_its_releases_cross_entropy(row_id: str, path: str) -> None:
    row = next(r for r in load_rows() if r.id == row_id)
    assert features_of(row_run_config(row)).cross_entropy == path


def test_an_unknown_fused_implementation_is_a_one_line_error() -> None:
    with pytest.raises(ValueError, match=r"^model.cross_entropy_fusion_impl: 'liger' is not one of native, te; set "):
        cross_entropy_bytes("liger")
