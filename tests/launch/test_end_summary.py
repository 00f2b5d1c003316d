"""The summary ``kilocard run`` ends with reads the committed step where the trainer commits it."""

from __future__ import annotations

from kilocard import exitcodes
from kilocard.config.compose import compose, to_run_config
from kilocard.launch.local import end_summary
from kilocard.rundir.checkpoint import checkpoint_root
from kilocard.rundir.names import CHECKPOINTS_DIR, TRACKER


def _committed_row(text: str) -> str:
    return next(line for line in text.splitlines() if line.startswith("last committed step")).split()[-1]


def test_summary_names_the_step_committed_under_checkpoint_save_outside_the_run_dir(tmp_path):
    """It said ``none`` when ``checkpoint.save`` was outside the run directory although a step was committed."""
    run_dir, save = tmp_path / "run", tmp_path / "elsewhere"
    run_dir.mkdir()
    save.mkdir()
    (save / TRACKER).write_text("12\n")
    cfg = to_run_config(compose(["recipe=tiny_gpt", f"checkpoint.save={save}"]))
    assert checkpoint_root(run_dir, cfg) == save
    assert _committed_row(end_summary(run_dir, cfg, exitcodes.DONE, 0)) == "12"


def test_summary_without_checkpoint_save_reads_the_run_dirs_own_checkpoints(tmp_path):
    cfg = to_run_config(compose(["recipe=tiny_gpt"]))
    assert _committed_row(end_summary(tmp_path, cfg, exitcodes.RETRY, 0)) == "none"
    (tmp_path / CHECKPOINTS_DIR).mkdir()
    (tmp_path / CHECKPOINTS_DIR / TRACKER).write_text("3\n")
    assert checkpoint_root(tmp_path, cfg) == tmp_path / CHECKPOINTS_DIR
    assert _committed_row(end_summary(tmp_path, cfg, exitcodes.RETRY, 0)) == "3"
