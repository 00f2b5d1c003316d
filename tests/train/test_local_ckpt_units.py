"""``kilocard.train.local_ckpt`` on one real gloo rank: NVRx's ``LocalCheckpointManager`` with kilocard's
sha256 sidecar, the integrity check before a resume, and the run's own directory under the root."""

from __future__ import annotations

import hashlib
import os
import socket
import sys

import pytest
import torch
import torch.distributed as dist

from kilocard.rundir import checkpoint as ck
from kilocard.train import local_ckpt as lc

pytestmark = pytest.mark.integration  # torch.distributed and NVRx's local checkpoint manager


@pytest.fixture(scope="module", autouse=True)
def one_rank():
    """A real one-rank gloo process group (NVRx's find_latest all-gathers over it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _tasd(value: float):
    from megatron.core.dist_checkpointing.mapping import ShardedTensor
    from megatron.core.dist_checkpointing.tensor_aware_state_dict import MCoreTensorAwareStateDict

    sd = {"w": ShardedTensor.from_rank_offsets("w", torch.full((4,), value)), "note": "x"}
    return MCoreTensorAwareStateDict.from_state_dict(sd, algo=lc.ALGO)[0]


def _tier(tmp_path, *steps: int) -> lc.LocalTier:
    tier = lc.LocalTier(tmp_path / "root", tmp_path / "run")
    for s in steps:
        tier.manager.save(_tasd(float(s)), s)
    return tier


def _file(tier: lc.LocalTier, step: int):
    return tier.directory / f"iter_{step:07d}_0_local.pt"


def test_a_saved_step_has_its_sha256_and_is_found_again(tmp_path):
    tier = _tier(tmp_path, 2, 4)
    f = _file(tier, 4)
    assert not _file(tier, 2).exists() and not (tier.directory / (_file(tier, 2).name + lc.DIGEST_SUFFIX)).exists()
    assert (tier.directory / (f.name + lc.DIGEST_SUFFIX)).read_text().strip() == hashlib.sha256(
        f.read_bytes()
    ).hexdigest()
    again = lc.LocalTier(tmp_path / "root", tmp_path / "run")  # as after a restart
    assert again.newest() == (4, [])
    tasd, _ = again.manager.load()
    assert torch.equal(next(iter(tasd.tensors)), torch.full((4,), 4.0))


def test_a_corrupted_copy_is_removed_and_not_resumed(tmp_path):
    f = _file(_tier(tmp_path, 6), 6)
    data = bytearray(f.read_bytes())
    data[len(data) // 2] ^= 0x01
    f.write_bytes(bytes(data))
    step, notes = lc.LocalTier(tmp_path / "root", tmp_path / "run").newest()
    assert step is None and notes == [f"rank 0: {f} fails its sha256 check (corrupted)"]
    assert not f.exists()


def test_a_copy_without_its_sha256_is_torn_and_an_unfinished_save_is_removed(tmp_path):
    tier = _tier(tmp_path, 6)
    f = _file(tier, 6)
    (tier.directory / (f.name + lc.DIGEST_SUFFIX)).unlink()
    dirty = tier.directory / "iter_0000008_0_local.dirty.pt"
    dirty.write_bytes(b"half")
    step, notes = lc.LocalTier(tmp_path / "root", tmp_path / "run").newest()
    assert step is None and notes == [f"rank 0: {f} has no .sha256 (torn or foreign)"]
    assert list(tier.directory.iterdir()) == []


def test_discard_after_removes_newer_steps_so_they_can_be_saved_again(tmp_path):
    tier = _tier(tmp_path, 8)
    tier.discard_after(6)
    assert list(tier.directory.iterdir()) == []
    tier.manager.save(_tasd(8.0), 8)  # NVRx refuses to overwrite an existing step file
    assert tier.newest() == (8, [])
    tier.remove()
    assert not tier.directory.parent.exists()


def test_each_run_directory_has_its_own_session(tmp_path):
    a, b = tmp_path / "a" / "run-1", tmp_path / "b" / "run-1"
    assert lc.session_id(a) != lc.session_id(b) and lc.session_id(a).startswith("kilocard-run-1-")


def test_default_root_is_node_memory_then_tmpdir():
    expected = "/dev/shm" if os.access("/dev/shm", os.W_OK) else "/scratch/tmp"
    assert str(lc.default_root({"TMPDIR": "/scratch/tmp"})) == expected


def test_newest_committed_is_what_a_local_step_must_beat(tmp_path):
    own, other = tmp_path / "own", tmp_path / "other"
    assert ck.newest_committed(own, None) == 0
    other.mkdir()
    (other / ck.TRACKER).write_text("30\n")
    assert ck.newest_committed(own, other) == 30 and ck.newest_committed(own, other, ckpt_step=20) == 20
    own.mkdir()
    (own / ck.TRACKER).write_text("12\n")
    assert ck.newest_committed(own, other) == 12
    (own / ck.TRACKER).write_text("garbage\n")
    assert ck.newest_committed(own, other) == 0


def test_a_lora_run_on_a_base_step_starts_at_step_0_so_its_local_steps_beat_it(tmp_path):
    """``peft=lora`` on ``checkpoint.load`` = another run's step 30: the run starts its adapters at step 0, so its
    local step 20 (before any persistent commit) is newer than where the persistent tier would start it; a LoRA
    step of ``checkpoint.load`` (adapters continued at its step) still counts with its number."""
    import dataclasses
    import json

    from kilocard.rundir.names import PEFT, STATE

    own, base = tmp_path / "own", tmp_path / "base"
    sdir = ck.step_dir(base, 30)
    sdir.mkdir(parents=True)
    (base / ck.TRACKER).write_text("30\n")
    state = ck.TrainerState(step=30, consumed_samples=0, scheduler={}, model={}, layout={}, padded_vocab_size=8)
    (sdir / STATE).write_text(json.dumps(dataclasses.asdict(state)))
    assert ck.newest_committed(own, base) == 30  # full training continues at step 30
    assert ck.newest_committed(own, base, lora=True) == 0
    lora_state = dataclasses.replace(state, extra={PEFT: {"dim": 8, "base": str(tmp_path / "b0")}})
    (sdir / STATE).write_text(json.dumps(dataclasses.asdict(lora_state)))
    assert ck.newest_committed(own, base, lora=True) == 30


def test_without_nvrx_the_tier_is_refused_naming_the_field(monkeypatch):
    """An install without the ``resiliency`` extra (stood in for by hiding NVRx's module: it is installed here)."""
    from kilocard.train.megatron_adapter import UnsupportedConfig

    monkeypatch.setitem(sys.modules, "nvidia_resiliency_ext.checkpointing.local.ckpt_managers.local_manager", None)
    with pytest.raises(UnsupportedConfig, match=r"checkpoint.non_persistent_save_interval needs nvidia-resiliency-ext"):
        lc._manager_class()
