"""``recipe=tiny_llama_sft``: supervised fine-tuning of the tiny Llama on the shipped chat set, one CPU rank.

The loss falls, the held-out validation split is evaluated every ``trainer.eval_interval`` steps, and
the whole run stays under a minute; and the issue's four commands (preprocess, import, fine-tune,
export) on the tiny Hugging Face twin. (That only assistant targets carry loss is shown on the samples
themselves: tests/data/test_data_sft.py.)
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path

import pytest
import torch

from conftest import KilocardRun
from kilocard.cli import main
from kilocard.paths import data_dir

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "convert"))
from tiny_hf import hf_tensors, make, model_class  # noqa: E402  (tests/convert's twin builder)

pytestmark = pytest.mark.slow


def test_tiny_llama_sft_trains_and_evaluates_in_under_a_minute(tmp_path) -> None:
    started = time.monotonic()
    code, out, run_dir = KilocardRun(tmp_path)("recipe=tiny_llama_sft", "--nproc", "1")
    elapsed = time.monotonic() - started
    assert code == 0, out[-3000:]
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train = [r["loss"] for r in records if "split" not in r]
    valid = [(r["step"], r["loss"]) for r in records if r.get("split") == "valid"]
    assert len(train) == 30
    assert sum(train[-5:]) / 5 < sum(train[:5]) / 5 - 1.0  # from about 5.8 to about 4
    assert [s for s, _ in valid] == [10, 20, 30] and valid[-1][1] < valid[0][1]
    assert elapsed < 60, f"{elapsed:.0f} s"


def test_hugging_face_model_fine_tuned_and_exported(tmp_path) -> None:
    """The issue's four commands on the tiny Llama twin (the chat tokenizer in its folder, 320 ids): preprocess
    with the folder's template, import, fine-tune from the import, export; transformers loads the export,
    and its weights moved away from the imported ones."""
    chat = data_dir("conf").parent / "data" / "tiny_chat"
    hf = tmp_path / "hf"
    make("llama", hf, vocab_size=320)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(chat / name, hf / name)
    args = ["--input", str(chat / "conversations.jsonl"), "--tokenizer", str(hf)]
    assert main(["preprocess", "--chat", *args, "--output-prefix", str(tmp_path / "data" / "sft")]) == 0
    assert main(["convert", "hf-to-mcore", str(hf), str(tmp_path / "base"), "recipe=tiny_llama_sft"]) == 0
    code, out, run_dir = KilocardRun(tmp_path)(
        "recipe=tiny_llama_sft",
        f"checkpoint.load={tmp_path / 'base'}",
        f"data.data_path=[{tmp_path / 'data' / 'sft_text_document'}]",
        f"data.tokenizer={hf}",
        "trainer.train_iters=10",
        "--nproc",
        "1",
    )
    assert code == 0, out[-3000:]
    assert "started from the model weights of" in (run_dir / "logs" / "train.log").read_text()
    out_hf = tmp_path / "out_hf"
    assert main(["convert", "mcore-to-hf", str(run_dir / "checkpoints" / "step_0000010"), str(out_hf)]) == 0
    tuned = model_class("llama").from_pretrained(out_hf).eval()
    before, after = hf_tensors(hf), hf_tensors(out_hf)
    assert before.keys() == after.keys()
    assert not torch.equal(before["model.embed_tokens.weight"], after["model.embed_tokens.weight"])
    with torch.no_grad():
        logits = tuned(torch.tensor([[2, 3, 4]])).logits
    assert logits.shape == (1, 3, 320) and torch.isfinite(logits).all()
    from transformers import AutoTokenizer  # the run's data.tokenizer went beside the weights

    text = "Where is the mill?"
    assert (
        AutoTokenizer.from_pretrained(out_hf)(text)["input_ids"] == AutoTokenizer.from_pretrained(hf)(text)["input_ids"]
    )
