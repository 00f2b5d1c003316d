"""A LoRA step knows its base by content: the base step's digest is recorded, and a base replaced at the same
path is refused (validate, the ranks and the export share ``checkpoint.lora_base`` / ``base_change``).

Before, a LoRA step recorded its base by path only: after the base directory was replaced by another run at the
same path, ``convert mcore-to-hf`` merged the adapters into the wrong base with exit 0.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest

from kilocard.config.compose import compose, to_run_config
from kilocard.perf.params import padded_vocab_size
from kilocard.rundir import checkpoint as ck

CFG = to_run_config(compose(["recipe=tiny_llama_sft", "peft=lora"]))


def _step(root: Path, step: int, weights: bytes, extra: dict | None = None) -> Path:
    """A committed step of ``CFG``'s model under ``root`` holding ``weights`` (and the ``extra`` state)."""
    sdir = ck.step_dir(root, step)
    sdir.mkdir(parents=True)
    (sdir / "__0_0.distcp").write_bytes(weights)
    state = ck.TrainerState(
        step, 0, {}, dataclasses.asdict(CFG.model), {}, padded_vocab_size(CFG.model, 1), extra=extra or {}
    )
    (sdir / "trainer_state.json").write_text(json.dumps(vars(state)))
    ck.commit_step(root, step, keep_last=5)
    return sdir


def _lora_run(tmp_path: Path, digest: bool = True) -> tuple[Path, Path]:
    """(the base step of an import, a LoRA step trained on it that records its base as the trainer does)."""
    base = _step(tmp_path / "base", 0, b"base weights A")
    saved = {**dataclasses.asdict(CFG.peft), "base": str(base)}
    if digest:
        saved[ck.BASE_DIGEST] = ck.content_digest(base)
    return base, _step(tmp_path / "lora", 3, b"adapters", {"peft": saved})


def _replace(base: Path, weights: bytes) -> None:
    """Another import at the same path."""
    shutil.rmtree(base.parent)
    _step(base.parent, 0, weights)


def test_the_recorded_base_is_accepted_and_a_replaced_one_refused(tmp_path):
    base, lora = _lora_run(tmp_path)
    state = ck.read_state(lora)
    assert ck.lora_base(state, lora) == base and ck.base_change(state, lora) is None
    _replace(base, b"base weights B")
    ck.verify_step(base)  # the new base is intact: only its content says it is another
    with pytest.raises(ck.CheckpointError, match="is not the base the LoRA adapters of .* were trained on"):
        ck.lora_base(state, lora)


def test_validate_refuses_a_lora_step_whose_base_was_replaced(tmp_path):
    base, lora = _lora_run(tmp_path)
    cfg = dataclasses.replace(CFG, checkpoint=dataclasses.replace(CFG.checkpoint, load=str(lora.parent)))
    assert ck.load_model_issues(cfg) == []
    _replace(base, b"base weights B")
    (issue,) = ck.load_model_issues(cfg)
    assert (issue.code, issue.field) == ("CHECKPOINT_BASE_CHANGED", "checkpoint.load")
    assert "the directory was replaced" in issue.message


def test_a_step_that_recorded_no_digest_is_checked_by_its_manifest_only(tmp_path):
    base, lora = _lora_run(tmp_path, digest=False)
    _replace(base, b"base weights B")
    assert ck.lora_base(ck.read_state(lora), lora) == base


def test_the_digest_is_of_the_content_not_of_who_committed_it(tmp_path):
    a = _step(tmp_path / "a", 0, b"same")
    b = _step(tmp_path / "b", 0, b"same")
    c = _step(tmp_path / "c", 0, b"other")
    assert ck.content_digest(a) == ck.content_digest(b) != ck.content_digest(c)
