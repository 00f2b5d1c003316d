"""``data.sft``: the assistant-only loss mask of ``preprocess --chat`` reaches the loss.

The samples are Megatron-Core ``GPTDataset`` windows of the shipped tiny chat set (``data/tiny_chat``);
which targets may carry loss is worked out here from the template's markers alone (``<|assistant|>``,
newline, then the answer through ``<|end|>``), independently of the mask file.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer

from kilocard.data.datasets import build_split_dataset, gpt_dataset_config
from kilocard.data.errors import DataError
from kilocard.data.split import TRAIN
from kilocard.data.tokenizer import get_tokenizer
from kilocard.paths import data_dir
from kilocard.train.megatron_adapter import masked_lm_loss
from run_configs import cfg_of

pytestmark = pytest.mark.integration  # renders with transformers' chat template / reads Megatron-Core datasets

CHAT = data_dir("conf").parent / "data" / "tiny_chat"
SAMPLES = 24


def _dataset(tmp_path, sft: bool = True, prefix: str = "data/tiny_chat/tiny_chat_text_document"):
    cfg = cfg_of(
        {
            "data.type": "indexed",
            "data.data_path": [prefix],
            "data.tokenizer": "data/tiny_chat",
            "data.sft": sft,
            "model.vocab_size": 320,
            "model.seq_length": 64,
        }
    )
    config = gpt_dataset_config(cfg, get_tokenizer(cfg.data.tokenizer), str(tmp_path / "cache"), False)
    return build_split_dataset(config, TRAIN, SAMPLES, sft)


def _assistant_targets(text: list[int], vocab: dict[str, int]) -> list[int | None]:
    """Per position of ``text``: 1 inside an assistant answer (its ``<|end|>`` included), 0 outside, None while
    unknown (before the window's first marker)."""
    specials = {vocab[t] for t in ("<|system|>", "<|user|>", "<|assistant|>", "<|end|>", "<|endoftext|>")}
    state, out = None, []
    for t in text:
        if t == vocab["<|assistant|>"]:
            state, flag = "header", 0
        elif state == "header":  # the newline after the marker
            state, flag = "answer", 0
        elif state == "answer":
            flag = 1
            state = "out" if t == vocab["<|end|>"] else state
        elif t in specials:  # an <|end|> before the first marker may close an answer: unknown
            flag = None if state is None else 0
            state = "out"
        else:
            flag = None if state is None else 0
        out.append(flag)
    return out


def test_only_assistant_targets_carry_loss(tmp_path) -> None:
    vocab = Tokenizer.from_file(str(CHAT / "tokenizer.json")).get_vocab()
    dataset = _dataset(tmp_path)
    counted = carried = 0
    for k in range(SAMPLES):
        s = dataset[k]
        text = torch.cat([s["tokens"], s["labels"][-1:]]).tolist()
        expected = _assistant_targets(text, vocab)[1:]  # the targets: text shifted left by one
        got = s["loss_mask"].tolist()
        for j, (e, g) in enumerate(zip(expected, got, strict=True)):
            if e is not None:
                assert g == e, (k, j, text)
                counted += 1
        carried += int(sum(got))
    assert counted > SAMPLES * 20 and 0 < carried < counted


def test_masked_out_targets_do_not_change_the_loss(tmp_path) -> None:
    """Per-token cross entropy of fixed logits (what GPTModel returns given labels) through the trainer's loss."""
    s = _dataset(tmp_path)[0]
    labels, mask = s["labels"], s["loss_mask"]
    logits = torch.randn(len(labels), 320, generator=torch.Generator().manual_seed(0))

    def loss(targets: torch.Tensor) -> torch.Tensor:
        return masked_lm_loss(torch.nn.functional.cross_entropy(logits, targets, reduction="none"), mask)

    reference = loss(labels)
    scrambled = torch.where(mask.bool(), labels, torch.randint(0, 320, labels.shape))
    assert not torch.equal(scrambled, labels)
    assert torch.equal(loss(scrambled), reference)  # the user and system targets have no say
    changed = labels.clone()
    j = int(mask.nonzero()[0])
    changed[j] = (labels[j] + 1) % 320
    assert not torch.equal(loss(changed), reference)  # an assistant target does
    plain = _dataset(tmp_path / "plain", sft=False)[0]  # the same window, every target counted
    assert torch.equal(plain["labels"], labels) and plain["loss_mask"].sum() > mask.sum()


def test_sft_without_a_mask_dataset_is_one_line(tmp_path) -> None:
    with pytest.raises(DataError) as err:
        _dataset(tmp_path, prefix="data/tiny_corpus/tiny_corpus_text_document")
    assert "has no loss mask" in str(err.value) and "preprocess --chat" in str(err.value)


def _validate(capsys, *overrides: str) -> tuple[int, str]:
    from kilocard.cli import main

    capsys.readouterr()
    code = main(["validate", "recipe=tiny_llama_sft", *overrides])
    text = capsys.readouterr()
    lines = (text.out + text.err).splitlines()
    return code, "\n".join(line for line in lines if line.startswith(("ERROR", "WARNING", "no problems")))


def test_validate_refuses_sft_data_without_its_mask_and_warns_on_chat_data_without_sft(tmp_path, capsys) -> None:
    shutil.copytree(CHAT, tmp_path / "chat")
    prefix = tmp_path / "chat" / "tiny_chat_text_document"
    assert _validate(capsys, f"data.data_path=[{prefix}]") == (0, "no problems found")
    code, lines = _validate(capsys, f"data.data_path=[{prefix}]", "data.sft=false")
    assert code == 0 and lines.startswith("WARNING SFT_OFF: data.sft = False: ") and "data.sft=true" in lines
    for ext in ("bin", "idx"):
        Path(f"{prefix}_loss_mask.{ext}").unlink()
    code, lines = _validate(capsys, f"data.data_path=[{prefix}]")
    assert code == 1 and lines.startswith("ERROR SFT_LOSS_MASK: data.data_path[0] = ") and "preprocess --chat" in lines
    code, lines = _validate(capsys, "data=mock", "data.sft=true")
    assert code == 1 and "ERROR SFT_LOSS_MASK: data.sft = True: " in lines
