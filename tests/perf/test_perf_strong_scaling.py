"""Strong scaling in the step-time model: a fixed model, layout and global batch as data parallelism grows.

Fewer micro-batches per data-parallel rank hide less of the gradient reduce-scatter and parameter
all-gather, the pipeline bubble's share grows and the straggler term grows with the GPU count: MFU must
fall, smoothly. How far it may fall is bounded by what the published strong-scaling series of
``baselines/published.yaml`` show between their smallest and largest GPU counts.
"""

from __future__ import annotations

import dataclasses

import pytest

from kilocard.calibration.baselines import compare_all, load_rows
from kilocard.calibration.series import series_checks
from kilocard.config.compose import compose, to_run_config
from kilocard.perf.predict import predict

#: DP degrees that divide the global batch below (1536 sequences, micro-batch 1): whole micro-batches only.
DPS = (2, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96)
GBS = 1536


def mfu_series(recipe: str) -> list[tuple[int, float]]:
    base = to_run_config(compose([f"recipe={recipe}"]))
    base = dataclasses.replace(base, trainer=dataclasses.replace(base.trainer, global_batch_size=GBS))
    par = base.parallel
    model_parallel = par.tensor_model_parallel_size * par.pipeline_model_parallel_size * par.context_parallel_size
    out = []
    for dp in DPS:
        world = model_parallel * dp
        if world % base.cluster.gpus_per_node == 0:
            cluster = dataclasses.replace(base.cluster, nodes=world // base.cluster.gpus_per_node)
            out.append((dp, predict(dataclasses.replace(base, cluster=cluster)).mfu))
    return out


@pytest.fixture(scope="module")
def published_largest_drop() -> float:
    """The largest MFU drop (positive, MFU points as a fraction) of any published scaling series."""
    checks = series_checks(load_rows(), compare_all())
    return max(-c.published_mfu_change for c in checks)


@pytest.mark.parametrize("recipe", ["llama3_8b", "llama3_70b"])
def test_mfu_falls_smoothly_as_data_parallelism_grows(recipe):
    series = mfu_series(recipe)
    assert len(series) >= 8
    for (_, a), (_, b) in zip(series, series[1:], strict=False):
        assert b <= a + 1e-9, series  # never faster per GPU with more GPUs for the same batch
        assert a - b < 0.015, series  # no jump of 1.5 MFU points between neighbouring DP degrees


@pytest.mark.parametrize("recipe", ["llama3_8b", "llama3_70b"])
def test_mfu_drop_is_within_what_published_strong_scaling_shows(recipe, published_largest_drop):
    """Llama 3 70B (TP4 PP4 CP2) from DP 2 to 96 lost 5.5 MFU points when the data-parallel collectives of
    an interleaved pipeline could hide only behind the last micro-batch's pass; Megatron-Core reduces (and
    gathers) each model chunk as its last backward ends (first forward begins), so the later chunks' share
    hides behind the passes of the others (``steptime.chunk_queue_exposed``), and the drop is now inside
    the published ones (Megatron-LM's 177B strong scaling: 5 points from 96 to 4,608 GPUs)."""
    series = mfu_series(recipe)
    drop = series[0][1] - series[-1][1]
    assert 0 < drop <= published_largest_drop + 0.005, (drop, published_largest_drop)
