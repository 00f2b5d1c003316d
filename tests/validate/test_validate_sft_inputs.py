"""``validate`` knows fine-tuning: the input checks that read files (``validate.datarecord``, ``rundir.checkpoint``).

- ``CHECKPOINT_MODEL_MISMATCH``: ``checkpoint.load``'s step (its ``trainer_state.json``, as ``convert
  hf-to-mcore`` and the trainer write it) holds another model than the config;
- ``SFT_TOO_LONG`` / ``SFT_TRUNCATED``: conversations longer than one sequence, counted; conversations that
  ``preprocess --chat --on-overflow truncate`` cut, counted from the record;
- ``SFT_CHAT_TEMPLATE`` / ``SFT_TEMPLATE_CHANGED``: the run's tokenizer folder has no chat template, or another
  one than the data was rendered with.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest

import bad_files
from kilocard.config.schema import PeftConfig
from kilocard.data.record import DataRecord, read_record
from kilocard.paths import data_dir
from kilocard.rundir.checkpoint import TrainerState, load_model_issues, step_dir
from kilocard.rundir.names import MANIFEST, STATE, TRACKER
from kilocard.validate.datarecord import data_record_issues, template_issues, too_long_issues, truncated_issues
from kilocard.validate.inputpaths import input_path_issues
from run_configs import cfg_of

CHAT = data_dir("conf").parent / "data" / "tiny_chat"
PREFIX = "tiny_chat_text_document"


def _checkpoint(root: Path, model: dict, padded: int, step: int = 0) -> Path:
    """A committed step as far as its model goes: the tracker and ``trainer_state.json`` (no tensors needed)."""
    sdir = step_dir(root, step)
    sdir.mkdir(parents=True)
    state = TrainerState(step=step, consumed_samples=0, scheduler={}, model=model, layout={}, padded_vocab_size=padded)
    (sdir / STATE).write_text(json.dumps(dataclasses.asdict(state)))
    (sdir / MANIFEST).write_text("{}")  # committed: its manifest is there (validate reads no tensor, nor hashes)
    (root / TRACKER).write_text(f"{step}\n")
    return root


def test_checkpoint_load_of_another_model_is_refused(tmp_path: Path) -> None:
    cfg = cfg_of({"model.vocab_size": 320, "model.make_vocab_size_divisible_by": 1})
    root = _checkpoint(tmp_path / "base", dataclasses.asdict(cfg.model), padded=320)
    same = dataclasses.replace(cfg, checkpoint=dataclasses.replace(cfg.checkpoint, load=str(root)))
    assert load_model_issues(same) == []
    wider = dataclasses.replace(same, model=dataclasses.replace(cfg.model, hidden_size=2 * cfg.model.hidden_size))
    (issue,) = load_model_issues(wider)
    assert issue.code == "CHECKPOINT_MODEL_MISMATCH" and issue.field == "checkpoint.load" and issue.severity == "error"
    assert f"model.hidden_size: {cfg.model.hidden_size} -> {2 * cfg.model.hidden_size}" in issue.message
    assert "step 0 of" in issue.message and "convert hf-to-mcore" in issue.hint
    longer = dataclasses.replace(same, model=dataclasses.replace(cfg.model, seq_length=4 * cfg.model.seq_length))
    assert load_model_issues(longer) == []  # a fine-tune may change the sequence length
    padded = dataclasses.replace(same, parallel=dataclasses.replace(cfg.parallel, tensor_model_parallel_size=3))
    (issue,) = load_model_issues(padded)
    assert "padded to 320 at save, 321 with tensor_model_parallel_size=3" in issue.message


def test_checkpoint_load_of_lora_adapters_the_config_does_not_continue_is_refused(tmp_path: Path) -> None:
    """A LoRA step (its trainer state names the ``peft`` it was trained with) continues only with ``peft=lora`` and
    adapters of its shape: refused before the run, as the ranks refuse it after the queue (the same check)."""
    cfg = cfg_of({"model.vocab_size": 320, "model.make_vocab_size_divisible_by": 1})
    root = _checkpoint(tmp_path / "lora", dataclasses.asdict(cfg.model), padded=320)
    state = json.loads((step_dir(root, 0) / STATE).read_text())
    peft = {"type": "lora", "dim": 4, "alpha": 32, "target_modules": ["linear_qkv"], "base": str(tmp_path / "base")}
    (step_dir(root, 0) / STATE).write_text(json.dumps({**state, "extra": {"peft": peft}}))
    load = dataclasses.replace(cfg.checkpoint, load=str(root))
    lora = PeftConfig(type="lora", dim=4, target_modules=["linear_qkv"])
    assert load_model_issues(dataclasses.replace(cfg, checkpoint=load, peft=lora)) == []
    (full,) = load_model_issues(dataclasses.replace(cfg, checkpoint=load))
    assert full.code == "CHECKPOINT_MODEL_MISMATCH" and "holds LoRA adapters only" in full.message
    wider = dataclasses.replace(lora, dim=8)
    (issue,) = load_model_issues(dataclasses.replace(cfg, checkpoint=load, peft=wider))
    assert "peft.dim: 4 -> 8" in issue.message and "peft.dim=4" in issue.hint
    (issue,) = load_model_issues(dataclasses.replace(cfg, checkpoint=load, peft=dataclasses.replace(lora, alpha=8)))
    assert "another shape or scale: peft.alpha: 32 -> 8" in issue.message and "peft.alpha=32" in issue.hint


def test_checkpoint_step_and_missing_directories(tmp_path: Path) -> None:
    """The step checked is ``checkpoint.ckpt_step``, else the newest committed one; a step that is not committed
    (or a directory with none) is ``CHECKPOINT_LOAD_EMPTY`` naming the committed steps, as the ranks would refuse it
    after the queue; a directory that does not exist is left to ``CHECKPOINT_LOAD_MISSING``."""
    cfg = cfg_of({"model.vocab_size": 320, "model.make_vocab_size_divisible_by": 1})
    root = _checkpoint(tmp_path / "base", dataclasses.asdict(cfg.model), padded=320)
    other = dataclasses.replace(cfg.model, num_layers=cfg.model.num_layers + 1)
    _checkpoint(tmp_path / "tmp", dataclasses.asdict(other), padded=320, step=5)
    shutil.move(step_dir(tmp_path / "tmp", 5), step_dir(root, 5))  # step 5 holds a deeper model
    (root / TRACKER).write_text("5\n")

    def codes(load: str, step: int | None = None) -> list[str]:
        ckpt = dataclasses.replace(cfg.checkpoint, load=load, ckpt_step=step)
        return [i.code for i in load_model_issues(dataclasses.replace(cfg, checkpoint=ckpt))]

    assert codes(str(root)) == ["CHECKPOINT_MODEL_MISMATCH"] and codes(str(root), 0) == []
    ckpt = dataclasses.replace(cfg.checkpoint, load=str(root), ckpt_step=3)
    (issue,) = load_model_issues(dataclasses.replace(cfg, checkpoint=ckpt))
    assert (issue.code, issue.field, issue.value) == ("CHECKPOINT_LOAD_EMPTY", "checkpoint.ckpt_step", 3)
    assert "committed: [0, 5]" in issue.message and "checkpoint.ckpt_step=null" in issue.hint
    (issue,) = load_model_issues(dataclasses.replace(cfg, checkpoint=dataclasses.replace(ckpt, load=str(tmp_path))))
    assert (issue.code, issue.field) == ("CHECKPOINT_LOAD_EMPTY", "checkpoint.load")
    assert "holds no committed step" in issue.message and "convert hf-to-mcore" in issue.hint
    assert codes(str(tmp_path), None) == ["CHECKPOINT_LOAD_EMPTY"]
    assert codes(str(tmp_path / "nowhere")) == []  # CHECKPOINT_LOAD_MISSING's
    (tmp_path / TRACKER).write_bytes(b"\xff\xfe")  # a tracker the ranks could not read either
    (issue,) = load_model_issues(dataclasses.replace(cfg, checkpoint=dataclasses.replace(ckpt, load=str(tmp_path))))
    assert issue.code == "CHECKPOINT_LOAD_EMPTY" and "is not UTF-8" in issue.message and TRACKER in issue.message


def test_conversations_longer_than_a_sequence_are_counted() -> None:
    cfg = cfg_of({"model.seq_length": 100})
    assert too_long_issues(cfg, "data.data_path[0]", "p", [50, 101, 90]) == []  # 101 = seq_length + 1 fits
    (issue,) = too_long_issues(cfg, "data.data_path[0]", "p", [50, 102, 300, 90])
    assert issue.code == "SFT_TOO_LONG" and issue.severity == "warning" and issue.field == "model.seq_length"
    assert "2 of 4 conversations are longer than model.seq_length + 1 = 101 tokens (the longest 300)" in issue.message
    assert "model.seq_length=299" in issue.hint and "--max-length 101 --on-overflow refuse" in issue.hint


def test_the_lengths_are_scanned_in_place(tmp_path: Path) -> None:
    """The ``.idx`` lengths (int32, memory-mapped as ``document_lengths`` gives them) are counted without a copy:
    less than a byte per conversation is allocated (an int64 copy of 4 million lengths was 32 MB)."""
    import tracemalloc

    import numpy

    n = 4_000_000
    path = tmp_path / "lengths.bin"
    written = numpy.full(n + 1, 50, dtype=numpy.int32)
    written[n // 2] = 300
    written.tofile(path)
    lengths = numpy.memmap(path, dtype=numpy.int32, mode="r")
    tracemalloc.start()
    try:
        (issue,) = too_long_issues(cfg_of({"model.seq_length": 100}), "data.data_path[0]", "p", lengths)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert f"1 of {n + 1} conversations are longer" in issue.message and "(the longest 300)" in issue.message
    assert peak < n, peak


def test_the_warning_says_what_becomes_of_the_tokens_past_a_sequence() -> None:
    """Cut (unpacked) or without loss (packed with ``data.reset_attention_mask``: ``SFTDataset`` zeroes the piece
    at the start of the next sample); packed without it, that piece is trained on (no loss is zeroed)."""
    messages = {}
    for packing, reset in ((False, False), (True, True), (True, False)):
        over = {"data.packing": packing, "data.reset_attention_mask": reset, "data.reset_position_ids": reset}
        (issue,) = too_long_issues(cfg_of({"model.seq_length": 100, **over}), "data.data_path[0]", "p", [300])
        messages[packing, reset] = issue.message
    assert messages[False, False].endswith("their tokens past that carry no loss")
    assert messages[True, True].endswith("their tokens past that carry no loss")
    assert messages[True, False].endswith("go on in the next sequence and are trained on without their prompt")


def test_truncated_conversations_are_reported_from_the_record() -> None:
    record = DataRecord(
        tokenizer="t", tokenizer_sha256=None, vocab_size=2, max_token_id=1, documents=9, tokens=90, max_length=10
    )
    assert truncated_issues("f", "p", record) == [] and truncated_issues("f", "p", None) == []
    (issue,) = truncated_issues("f", "p", dataclasses.replace(record, truncated=3))
    assert issue.code == "SFT_TRUNCATED" and "3 of 9 conversations were cut to --max-length 10 tokens" in issue.message


def _sft(tokenizer: Path, prefix: Path) -> object:
    return cfg_of(
        {
            "data.type": "indexed",
            "data.data_path": [str(prefix)],
            "data.tokenizer": str(tokenizer),
            "data.sft": True,
            "model.vocab_size": 320,
            "model.seq_length": 256,
        }
    )


def test_the_tokenizer_folder_must_hold_the_template_the_data_was_rendered_with(tmp_path: Path) -> None:
    folder = tmp_path / "chat"
    shutil.copytree(CHAT, folder)
    prefix = folder / PREFIX
    record = read_record(str(prefix))
    assert record is not None and record.chat_template_sha256  # the shipped record names its template
    assert template_issues(_sft(folder, prefix), [(str(prefix), record)]) == []
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["chat_template"] = config["chat_template"].replace("<|end|>", "<|end|>\n")
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    (changed,) = template_issues(_sft(folder, prefix), [(str(prefix), record)])
    assert changed.code == "SFT_TEMPLATE_CHANGED" and changed.severity == "warning"
    del config["chat_template"]
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    (missing,) = template_issues(_sft(folder, prefix), [(str(prefix), record)])
    assert missing.code == "SFT_CHAT_TEMPLATE" and missing.severity == "error" and "no chat template" in missing.message
    (folder / "chat_template.jinja").write_text(
        json.loads((CHAT / "tokenizer_config.json").read_text())["chat_template"]
    )
    assert template_issues(_sft(folder, prefix), [(str(prefix), record)]) == []  # transformers reads the file too


@pytest.mark.parametrize("kind", ["fifo", "dir", "broken", "binary", "latin1", "empty", "secret_json"])
def test_a_bad_tokenizer_config_is_reported_once(tmp_path: Path, kind: str) -> None:
    """The tokenizer and the chat-template checks both read tokenizer_config.json: a file that cannot be
    read is one issue, with the file and what it is, not one per reader."""
    folder = tmp_path / "chat"
    shutil.copytree(CHAT, folder)
    (folder / "tokenizer_config.json").unlink()
    bad_files.make(kind, folder / "tokenizer_config.json")
    issues = bad_files.finishes(lambda: input_path_issues(_sft(folder, folder / PREFIX)))["value"]
    about = [i for i in issues if "tokenizer_config.json" in i.message]
    assert len(about) == 1, [i.to_json() for i in issues]
    assert about[0].severity == "error" and bad_files.SECRET not in about[0].message


def test_the_shipped_chat_set_passes_and_a_short_sequence_is_counted(tmp_path: Path) -> None:
    prefix = CHAT / PREFIX
    assert data_record_issues(_sft(CHAT, prefix)) == []
    short = dataclasses.replace(_sft(CHAT, prefix), model=dataclasses.replace(_sft(CHAT, prefix).model, seq_length=64))
    assert [i.code for i in data_record_issues(short)] == ["SFT_TOO_LONG"]
    assert "986 of 1040 conversations are longer than model.seq_length + 1 = 65 tokens (the longest 240)" in (
        data_record_issues(short)[0].message
    )


def test_conversations_without_a_trained_assistant_token_are_refused() -> None:
    """``SFT_NO_LOSS``: one conversation per sequence cut at 16 tokens leaves every answer past the cut (the
    prompts are longer): the run would train with loss 0.0 and grad norm 0.0. At 48 tokens some still keep one
    (a warning counting the rest); packed, every conversation has its answer."""
    cut = _sft(CHAT, CHAT / PREFIX)

    def at(seq: int, packing: bool) -> list:
        model = dataclasses.replace(cut.model, seq_length=seq)
        return [
            i
            for i in data_record_issues(
                dataclasses.replace(cut, model=model, data=dataclasses.replace(cut.data, packing=packing))
            )
            if i.code == "SFT_NO_LOSS"
        ]

    (none,) = at(16, packing=False)
    assert none.severity == "error" and none.field == "data.data_path[0]"
    assert "none of its 1040 conversations has an assistant token in their first model.seq_length tokens" in (
        none.message
    )
    (some,) = at(48, packing=False)
    assert some.severity == "warning" and "552 of 1040 conversations have no assistant token" in some.message
    assert at(16, packing=True) == []


CORPUS = data_dir("conf").parent / "data" / "tiny_corpus" / "tiny_corpus_text_document"
"""Another dataset: the shipped corpus, as many documents as the chat set, of other lengths."""


def _copy_chat(dst: Path) -> Path:
    """The shipped chat prefix (data, loss mask, record) under ``dst``."""
    dst.mkdir()
    for f in CHAT.glob(f"{PREFIX}*"):
        shutil.copy(f, dst / f.name)
    return dst / PREFIX


def test_a_record_is_checked_against_the_index_beside_it(tmp_path: Path) -> None:
    """Another dataset's ``.bin/.idx`` copied over a prefix (the record's token count is not the index's) used to
    validate and then crash IndexError in the ranks."""
    prefix = _copy_chat(tmp_path / "copy")
    assert data_record_issues(_sft(CHAT, prefix)) == []
    for suffix in (".bin", ".idx"):
        shutil.copy(f"{CORPUS}{suffix}", f"{prefix}{suffix}")
    issues = [i for i in data_record_issues(_sft(CHAT, prefix)) if i.code == "DATA_RECORD_STALE"]
    assert [(i.severity, i.field) for i in issues] == [("error", "data.data_path[0]")], issues
    record = read_record(str(prefix))
    assert f"describes {record.documents} documents and {record.tokens} tokens" in issues[0].message
    assert "the .bin/.idx are not the ones it was written with" in issues[0].message


def test_a_loss_mask_of_another_dataset_is_refused(tmp_path: Path) -> None:
    """A loss mask of another dataset (here of the same document count, other lengths) validated and crashed
    after the queue."""
    prefix = _copy_chat(tmp_path / "copy")
    for suffix in (".bin", ".idx"):
        shutil.copy(f"{CORPUS}{suffix}", f"{prefix}_loss_mask{suffix}")
    issues = [i for i in data_record_issues(_sft(CHAT, prefix)) if i.severity == "error"]
    assert [i.code for i in issues] == ["SFT_LOSS_MASK_MISMATCH"], issues
    assert "the loss mask belongs to another dataset" in issues[0].message
