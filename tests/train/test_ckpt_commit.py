"""Checkpoint commit protocol and integrity checks (pure file-level behaviour, no ranks)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kilocard.config.schema import ModelConfig
from kilocard.rundir import checkpoint as ck

#: Also run on every other supported megatron-core release (scripts/test.sh, second pass).
pytestmark = pytest.mark.mcore_range


def _commit(root: Path, step: int, payload: bytes = b"weights") -> Path:
    d = ck.step_dir(root, step)
    (d / "rng").mkdir(parents=True)
    (d / "__0_0.distcp").write_bytes(payload * 100)
    (d / "rng" / "rank_00000.pt").write_bytes(b"rng")
    ck.commit_step(root, step, keep_last=10)
    return d


def test_manifest_lists_every_file_with_size_and_sha(tmp_path):
    d = _commit(tmp_path, 10)
    m = json.loads((d / ck.MANIFEST).read_text())
    assert m["step"] == 10 and set(m["files"]) == {"__0_0.distcp", "rng/rank_00000.pt"}
    assert m["files"]["__0_0.distcp"]["size"] == 700
    ck.verify_step(d)


def test_corrupted_or_missing_shard_names_step_and_file(tmp_path):
    d = _commit(tmp_path, 10)
    shard = d / "__0_0.distcp"
    data = bytearray(shard.read_bytes())
    data[5] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(ck.CheckpointError, match=r"checkpoint step 10: file .*__0_0\.distcp fails its sha256"):
        ck.verify_step(d)
    shard.unlink()
    with pytest.raises(ck.CheckpointError, match=r"checkpoint step 10: file .*__0_0\.distcp is missing"):
        ck.verify_step(d)
    with pytest.raises(ck.CheckpointError, match="step 10"):
        ck.load_root_and_step(tmp_path, None, fallback=False)


def test_fallback_to_previous_committed_step(tmp_path):
    _commit(tmp_path, 5)
    d10 = _commit(tmp_path, 10)
    (d10 / "__0_0.distcp").write_bytes(b"truncated")
    said: list[str] = []
    assert ck.load_root_and_step(tmp_path, None, fallback=True, say=said.append) == (tmp_path, 5)
    (line,) = said  # the fall back is in the run's log, not silent
    assert "checkpoint step 10: file" in line and "manifest says 700 (truncated or altered)" in line
    assert line.endswith("checkpoint.fallback_to_previous: using step 5 instead of 10")


def test_partial_step_is_never_loaded(tmp_path):
    """A step written by every rank but not committed (no manifest, tracker not advanced) is ignored."""
    _commit(tmp_path, 5)
    partial = ck.step_dir(tmp_path, 10)
    partial.mkdir()
    (partial / "__0_0.distcp").write_bytes(b"half")
    assert ck.committed_steps(tmp_path) == [5]
    assert ck.load_root_and_step(tmp_path, None, fallback=False) == (tmp_path, 5)


def test_fresh_start_and_load_dir_and_ckpt_step(tmp_path):
    own, other = tmp_path / "own", tmp_path / "other"
    own.mkdir()
    other.mkdir()
    assert ck.load_root_and_step(own, None, fallback=False) == (None, None)
    _commit(other, 4)
    _commit(other, 8)
    assert ck.load_root_and_step(own, other, fallback=False) == (other, 8)
    assert ck.load_root_and_step(own, other, fallback=False, ckpt_step=4) == (other, 4)
    with pytest.raises(ck.CheckpointError, match="checkpoint.ckpt_step: step 6 is not committed"):
        ck.load_root_and_step(own, other, fallback=False, ckpt_step=6)
    _commit(own, 2)  # once the run has its own steps, they win
    assert ck.load_root_and_step(own, other, fallback=False) == (own, 2)
    with pytest.raises(ck.CheckpointError, match="holds no committed step"):
        ck.load_root_and_step(tmp_path / "x", tmp_path / "empty", fallback=False)


def test_prune_keeps_last_committed_only_after_commit(tmp_path):
    for s in (2, 4, 6):
        _commit(tmp_path, s)
    ck.prune(tmp_path, keep_last=2, newest=6)
    assert sorted(p.name for p in tmp_path.glob("step_*")) == ["step_0000004", "step_0000006"]


def test_tracker_write_is_atomic_and_validated(tmp_path):
    ck.atomic_write(tmp_path / ck.TRACKER, "12\n")
    assert ck.latest_committed(tmp_path) == 12
    assert not list(tmp_path.glob(".*tmp*"))
    (tmp_path / ck.TRACKER).write_text("garbage")
    with pytest.raises(ck.CheckpointError, match="expected a step number"):
        ck.latest_committed(tmp_path)


def test_model_differences_name_shape_fields_only():
    saved = ck.asdict(ModelConfig(num_layers=4, hidden_size=64))
    now = ModelConfig(num_layers=2, hidden_size=64, name="renamed", hidden_dropout=0.1)
    assert ck.model_differences(saved, now) == ["model.num_layers: 4 -> 2"]


def _flip_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def test_dot_files_like_torch_dist_metadata_are_in_the_manifest(tmp_path):
    """torch_dist's ``.metadata`` (which shard holds which tensor) is hashed like every other file:
    altered or deleted, the step fails its check naming it, and fallback takes the step before."""
    _commit(tmp_path, 5)
    d = ck.step_dir(tmp_path, 10)
    d.mkdir(parents=True)
    (d / ".metadata").write_bytes(b"which shard holds which tensor" * 10)
    d10 = _commit(tmp_path, 10)
    assert ".metadata" in json.loads((d10 / ck.MANIFEST).read_text())["files"]
    _flip_byte(d10 / ".metadata")
    with pytest.raises(ck.CheckpointError, match=r"checkpoint step 10: file .*/\.metadata fails its sha256"):
        ck.verify_step(d10)
    (d10 / ".metadata").unlink()
    with pytest.raises(ck.CheckpointError, match=r"checkpoint step 10: file .*/\.metadata is missing"):
        ck.verify_step(d10)
    assert ck.load_root_and_step(tmp_path, None, fallback=True) == (tmp_path, 5)


def test_file_added_after_the_commit_fails_the_check(tmp_path):
    """A file the manifest does not list (added after the commit, or by a writer that skipped it) is refused."""
    d = _commit(tmp_path, 10)
    (d / ".metadata").write_bytes(b"unverified")
    with pytest.raises(ck.CheckpointError, match=rf"checkpoint step 10: file .*/\.metadata is not in {ck.MANIFEST}"):
        ck.verify_step(d)


def test_bad_step_error_names_the_intact_step_and_a_fix_that_works_with_resume(tmp_path):
    """Without fallback the error names the newest intact committed step and how to resume from it:
    rewrite the tracker of the run's own checkpoints (``kilocard run --resume`` takes no overrides),
    or ``checkpoint.ckpt_step`` for a ``checkpoint.load`` directory; and says when no step is intact."""
    for s in (4, 8, 12):
        _commit(tmp_path, s)
    _flip_byte(ck.step_dir(tmp_path, 12) / "__0_0.distcp")
    tracker = tmp_path / ck.TRACKER
    with pytest.raises(ck.CheckpointError) as e:
        ck.load_root_and_step(tmp_path, None, fallback=False)
    assert "checkpoint step 12: file" in str(e.value)
    assert f"step 8 is the newest committed step that passes; to resume from it, write 8 into {tracker}" in str(e.value)
    assert "fallback_to_previous" not in str(e.value)
    with pytest.raises(ck.CheckpointError, match=r"start a new run with checkpoint.ckpt_step=8"):
        ck.load_root_and_step(tmp_path / "own", tmp_path, fallback=False)
    for s in (4, 8):
        _flip_byte(ck.step_dir(tmp_path, s) / "__0_0.distcp")
    with pytest.raises(ck.CheckpointError, match=r"no older committed step under .* passes its integrity check"):
        ck.load_root_and_step(tmp_path, None, fallback=False)
