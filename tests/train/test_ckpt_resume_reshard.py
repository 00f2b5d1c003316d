"""Resume onto another layout, refusals of a changed model, and integrity checks on load.

One straight TP2xPP2 run on 4 CPU ranks (tiny corpus, distributed optimizer, 12 steps, committed
at steps 6 and 12) is shared by the tests of this module: it is also the TP2xPP2 layout test.
Single-rank loads run ``python -m kilocard.train <run_dir>`` directly, as srun does, with Slurm's
rank variables.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from conftest import KilocardRun
from kilocard import exitcodes

#: Also run on every other supported megatron-core release (scripts/test.sh, second pass).
pytestmark = pytest.mark.mcore_range

# Vocabulary padding must not depend on TP for a TP2 -> TP1 resume (258 rows either way).
COMMON = [
    "recipe=tiny_gpt",
    "data=tiny_corpus",
    "parallel.use_distributed_optimizer=true",
    "trainer.train_iters=12",
    "model.make_vocab_size_divisible_by=1",
]
TOLERANCE = 1e-4
"""Largest |loss difference| allowed between the straight run and a run resumed onto another layout
(measured: 4.8e-7, float summation order of TP1 versus TP2)."""


def losses(run_dir):
    """{step: loss} from metrics.jsonl."""
    return {r["step"]: r["loss"] for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())}


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """The straight TP2xPP2 run: (runner, run dir)."""
    runner = KilocardRun(tmp_path_factory.mktemp("straight"))
    code, out, run_dir = runner(
        *COMMON,
        "parallel.tensor_model_parallel_size=2",
        "parallel.pipeline_model_parallel_size=2",
        "checkpoint.save_interval=6",
        "--nproc",
        "4",
    )
    assert code == 0, out[-3000:]
    return runner, run_dir


def single_rank(tmp_path, overrides):
    """Create a run dir for ``overrides`` and run ``python -m kilocard.train`` on it with Slurm's variables."""
    from kilocard.base.net import free_port
    from kilocard.config.compose import compose
    from kilocard.launch.rundir import create_run_dir

    tmp_path.mkdir(parents=True, exist_ok=True)  # kilocard makes only the runs folder itself, never its parents
    run_dir = create_run_dir(compose(overrides), overrides, root=tmp_path / "runs")
    env = dict(
        os.environ,
        OMP_NUM_THREADS="1",
        TMPDIR=str(tmp_path),
        SLURM_PROCID="0",
        SLURM_NTASKS="1",
        SLURM_LOCALID="0",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(free_port()),
    )
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        env.pop(k, None)
    proc = subprocess.run(
        [sys.executable, "-m", "kilocard.train", str(run_dir)], capture_output=True, text=True, env=env, timeout=300
    )
    return proc.returncode, proc.stdout + proc.stderr, run_dir


def test_tp2pp2_trains_and_commits(straight):
    _, run_dir = straight
    ls = losses(run_dir)
    assert sorted(ls) == list(range(1, 13)) and ls[12] < ls[1] - 0.5
    ckpts = run_dir / "checkpoints"
    assert (ckpts / "latest_committed.txt").read_text().strip() == "12"
    assert sorted(p.name for p in ckpts.glob("step_*")) == ["step_0000006", "step_0000012"]


def test_resume_onto_tp1pp4_continues_the_loss_curve(straight):
    runner, s_dir = straight
    code, out, run_dir = runner(
        *COMMON,
        "parallel.pipeline_model_parallel_size=4",
        f"checkpoint.load={s_dir / 'checkpoints'}",
        "checkpoint.ckpt_step=6",
        "--nproc",
        "4",
    )
    assert code == 0, out[-3000:]
    assert "RNG re-seeded (layout changed)" in (run_dir / "logs" / "train.log").read_text()
    ref, got = losses(s_dir), losses(run_dir)
    assert sorted(got) == list(range(7, 13))
    worst = max(abs(got[s] - ref[s]) for s in got)
    assert worst <= TOLERANCE, f"TP1xPP4 continuation differs from the TP2xPP2 run by {worst:.2e}: {got} vs {ref}"


def test_changed_model_shape_is_refused_by_name(straight, tmp_path):
    _, s_dir = straight
    code, out, _ = single_rank(
        tmp_path, COMMON + ["model.num_layers=2", "model.hidden_size=128", f"checkpoint.load={s_dir / 'checkpoints'}"]
    )
    assert code == exitcodes.BAD_CONFIG, out[-3000:]
    assert "model.hidden_size: 64 -> 128" in out and "model.num_layers: 4 -> 2" in out


def test_corrupted_shard_is_refused_then_previous_step_used(straight, tmp_path):
    _, s_dir = straight
    copy = tmp_path / "ckpts"
    shutil.copytree(s_dir / "checkpoints", copy)
    shard = sorted((copy / "step_0000012").glob("*.distcp"))[0]
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))

    code, out, _ = single_rank(tmp_path / "a", COMMON + [f"checkpoint.load={copy}"])
    assert code == exitcodes.BAD_CKPT, out[-3000:]
    assert f"checkpoint step 12: file {shard} fails its sha256 check" in out

    code, out, run_dir = single_rank(
        tmp_path / "b", COMMON + [f"checkpoint.load={copy}", "checkpoint.fallback_to_previous=true"]
    )
    assert code == exitcodes.DONE, out[-3000:]
    assert "resumed from" in out and "step_0000006" in out
    assert sorted(losses(run_dir)) == list(range(7, 13))  # resharded TP2xPP2 -> one rank


def test_altered_frozen_config_is_refused(straight, tmp_path):
    _, s_dir = straight
    run_dir = tmp_path / "altered"
    run_dir.mkdir()
    for name in ("config.yaml", "config.sha256"):
        shutil.copy(s_dir / name, run_dir / name)
    cfg = run_dir / "config.yaml"
    cfg.write_text(cfg.read_text().replace("train_iters: 12", "train_iters: 13"))
    proc = subprocess.run(
        [sys.executable, "-m", "kilocard.train", str(run_dir)],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
    )
    assert proc.returncode == exitcodes.BAD_CONFIG
    assert "config.yaml: sha256" in proc.stderr and "does not match config.sha256" in proc.stderr
