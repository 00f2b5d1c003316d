"""A run is complete (``run --resume`` starts no rank) only when its last committed step is intact."""

from __future__ import annotations

from kilocard.config.compose import compose, to_run_config
from kilocard.rundir import checkpoint as ck


def _run(tmp_path, iters: int = 4):
    cfg = to_run_config(compose(["recipe=tiny_gpt", f"trainer.train_iters={iters}"]))
    root = ck.checkpoint_root(tmp_path, cfg)
    for step in (2, iters):
        sdir = ck.step_dir(root, step)
        sdir.mkdir(parents=True)
        (sdir / "__0_0.distcp").write_bytes(b"x" * (100 + step))
        (sdir / ".metadata").write_bytes(b"meta")
        ck.commit_step(root, step, keep_last=3)
    return cfg, root


def test_a_run_whose_last_committed_step_is_the_last_iteration_is_complete(tmp_path):
    cfg, _ = _run(tmp_path)
    assert ck.completed_step(tmp_path, cfg) == 4
    longer = to_run_config(compose(["recipe=tiny_gpt", "trainer.train_iters=8"]))
    assert ck.completed_step(tmp_path, longer) is None


def test_a_finished_run_whose_last_step_lost_a_file_is_not_complete(tmp_path):
    """With the newest step damaged the ranks must start: they fall back to the previous step
    (``checkpoint.fallback_to_previous``) or refuse the checkpoint; a 'complete' answer would hide it."""
    cfg, root = _run(tmp_path)
    (ck.step_dir(root, 4) / ".metadata").unlink()
    assert ck.completed_step(tmp_path, cfg) is None
    cfg, root = _run(tmp_path / "truncated")
    (ck.step_dir(root, 4) / "__0_0.distcp").write_bytes(b"x")
    assert ck.completed_step(tmp_path / "truncated", cfg) is None


def test_a_corrupted_or_foreign_last_step_is_not_complete(tmp_path):
    cfg, root = _run(tmp_path)
    (ck.step_dir(root, 4) / "__0_0.distcp").write_bytes(b"y" * 104)  # same size, other bytes
    assert ck.completed_step(tmp_path, cfg) is None
    cfg, root = _run(tmp_path / "a")
    (root / "owner.json").write_text('{"run": "/somewhere/else"}')
    assert ck.completed_step(tmp_path / "a", cfg) is None
