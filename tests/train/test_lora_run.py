"""``peft=lora`` end to end on the tiny Llama twin: import, fine-tune the adapters (two CPU ranks, TP 2 with
sequence parallelism: A and B sharded as Megatron-Bridge shards them), resume, export merged and adapter-only.

One training run and one resume: the steps hold the adapters only, the loss falls, a resume from step 3
gives steps 4-6 bit for bit, the merged export equals base + (alpha/dim)·B·A with every other tensor the
base's own (no base weight changed), transformers' logits on it equal kilocard's LoRA model's on the same
tokens, and (where the ``peft`` library is installed) PEFT's model on the adapter-only export gives the same.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import KilocardRun
from kilocard import exitcodes
from kilocard.cli import main
from kilocard.paths import data_dir
from kilocard.rundir.checkpoint import content_digest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "convert"))
from tiny_hf import hf_tensors, make  # noqa: E402  (tests/convert's twin builder)

pytestmark = [pytest.mark.slow, pytest.mark.mcore_range]

DIM, ALPHA = 8, 16
TARGET_HF = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _records(run_dir: Path) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if "split" not in r]


def _adapter(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(path / "adapter_model.safetensors"))


REFERENCE = """
import sys, torch, transformers
base, adapter, out = sys.argv[1], sys.argv[2], sys.argv[3]
model = transformers.LlamaForCausalLM.from_pretrained(base)
if adapter:
    import peft
    model = peft.PeftModel.from_pretrained(model, adapter)
with torch.no_grad():
    torch.save(model.eval()(torch.load(out + ".tokens.pt")).logits, out)
"""
"""transformers' (and PEFT's) logits, in a process of their own: kilocard's CPU shim, which the in-process
conversions install, changes transformers' CPU attention results by about 5e-3."""


def _reference_logits(tmp: Path, tokens: torch.Tensor, model_dir: Path, adapter: Path | None = None) -> torch.Tensor:
    out = tmp / f"logits_{model_dir.name}_{adapter.name if adapter else 'none'}.pt"
    torch.save(tokens, f"{out}.tokens.pt")
    cmd = [sys.executable, "-c", REFERENCE, str(model_dir), str(adapter or ""), str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return torch.load(out)


def _kilocard_logits(step: Path, tokens: torch.Tensor) -> torch.Tensor:
    """The trainer's LoRA model (adapters unmerged, their forward hooks on), base and adapters loaded, one rank."""
    from kilocard.convert import model as mm
    from kilocard.convert.command import saved_model
    from kilocard.convert.peft_io import lora_of
    from kilocard.rundir import checkpoint as ck
    from kilocard.train import lora
    from kilocard.train import megatron_adapter as ma

    state = ck.read_state(step)
    peft, base = lora_of(state, step)
    assert peft is not None and base is not None
    run_cfg = mm.single_rank_config(mm.run_config_for(saved_model(state), torch.float32, peft), state.padded_vocab_size)
    with mm.single_rank():
        ma.seed_all(0)  # dot-product attention forks Megatron's RNG tracker
        model = mm.build(run_cfg)
        mm.load(model, base, lora.base_part)
        mm.load(model, step, lora.adapter_part)
        s = tokens.shape[1]
        causal = torch.ones(1, 1, s, s, dtype=torch.bool).triu(1)
        with torch.no_grad():
            return model(tokens, torch.arange(s).unsqueeze(0), causal)[..., :320]


def test_lora_fine_tune_resume_and_export(tmp_path) -> None:
    from megatron.core import dist_checkpointing

    chat = data_dir("conf").parent / "data" / "tiny_chat"
    hf, base = tmp_path / "hf", tmp_path / "ckpt" / "base"
    make("llama", hf, vocab_size=320)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(chat / name, hf / name)
    assert main(["convert", "hf-to-mcore", str(hf), str(base), "recipe=tiny_llama_sft"]) == 0

    run = KilocardRun(tmp_path)
    code, out, run_dir = run(
        "recipe=tiny_llama_sft",
        "peft=lora",
        f"peft.dim={DIM}",
        f"peft.alpha={ALPHA}",
        f"checkpoint.load={base}",
        f"data.data_path=[{chat / 'tiny_chat_text_document'}]",
        f"data.tokenizer={hf}",
        "trainer.train_iters=6",
        "trainer.eval_interval=null",
        "checkpoint.save_interval=3",
        "parallel.tensor_model_parallel_size=2",
        "parallel.sequence_parallel=true",
        "--nproc",
        "2",
    )
    assert code == 0, out[-3000:]
    assert "started LoRA adapters on the frozen base weights of" in (run_dir / "logs" / "train.log").read_text()
    first = _records(run_dir)
    assert [r["step"] for r in first] == [1, 2, 3, 4, 5, 6]
    assert first[-1]["loss"] < first[0]["loss"]

    ckpts = run_dir / "checkpoints"
    for step in ("step_0000003", "step_0000006"):  # the adapters (and their optimizer state) only
        keys = list(dist_checkpointing.load_tensors_metadata(str(ckpts / step)))
        assert keys and all(".adapter.linear_" in k for k in keys), keys[:5]
    # the log's count of trainable parameters is the adapters' whole size as the checkpoint holds them
    meta = dist_checkpointing.load_tensors_metadata(str(ckpts / "step_0000006"))
    saved = sum(math.prod(t.global_shape) for k, t in meta.items() if not k.startswith("optimizer"))
    log = (run_dir / "logs" / "train.log").read_text()
    assert f"kilocard.train: peft=lora: {saved:,} trainable of " in log, log[-3000:]
    assert "deprecating ShardedTensor" not in log  # torch's note on every load, filtered (kilocard.base.quiet)
    state = json.loads((ckpts / "step_0000006" / "trainer_state.json").read_text())
    assert state["extra"]["peft"]["base"] == str((base / "step_0000000").resolve())
    assert state["extra"]["peft"]["base_digest"] == content_digest(base / "step_0000000")

    assert main(["convert", "mcore-to-hf", str(ckpts / "step_0000006"), str(tmp_path / "ad1"), "--adapter-only"]) == 0
    assert main(["convert", "mcore-to-hf", str(base), str(tmp_path / "none"), "--adapter-only"]) == 2  # no adapters
    assert not (tmp_path / "none").exists()

    (ckpts / "latest_committed.txt").write_text("3\n")  # resume from step 3 and train steps 4-6 again
    code, out, _ = run("--resume", str(run_dir), "--nproc", "2")
    assert code == 0, out[-3000:]
    assert "resumed from" in (run_dir / "logs" / "train.log").read_text()
    again = _records(run_dir)
    assert [(r["step"], r["loss"]) for r in again] == [(r["step"], r["loss"]) for r in first]

    step6 = ckpts / "step_0000006"
    assert main(["convert", "mcore-to-hf", str(step6), str(tmp_path / "ad2"), "--adapter-only"]) == 0
    assert main(["convert", "mcore-to-hf", str(step6), str(tmp_path / "out_hf")]) == 0
    ad1, ad2 = _adapter(tmp_path / "ad1"), _adapter(tmp_path / "ad2")
    assert ad1.keys() == ad2.keys() and all(torch.equal(ad1[k], ad2[k]) for k in ad1)
    config = json.loads((tmp_path / "ad2" / "adapter_config.json").read_text())
    assert (config["peft_type"], config["r"], config["lora_alpha"]) == ("LORA", DIM, ALPHA)
    assert sorted(config["target_modules"]) == sorted(TARGET_HF)

    before, merged = hf_tensors(hf), hf_tensors(tmp_path / "out_hf")
    assert before.keys() == merged.keys()
    adapted = 0
    for name, w in before.items():
        module = name.removesuffix(".weight")
        a = ad2.get(f"base_model.model.{module}.lora_A.weight")
        if a is None:  # embeddings, norms, the output layer: frozen and untouched
            assert torch.equal(merged[name], w), name
            continue
        b = ad2[f"base_model.model.{module}.lora_B.weight"]
        assert a.shape == (DIM, w.shape[1]) and b.shape == (w.shape[0], DIM)
        torch.testing.assert_close(merged[name], w + (ALPHA / DIM) * (b @ a), rtol=0, atol=1e-6)
        adapted += int(not torch.equal(merged[name], w))
    assert adapted == 2 * len(TARGET_HF)  # every target of both layers moved

    tokens = torch.tensor([[5, 17, 42, 99, 7, 250, 3, 64, 128, 11]])
    reference = _reference_logits(tmp_path, tokens, tmp_path / "out_hf")
    ours = _kilocard_logits(step6, tokens)
    assert (ours - reference).abs().max().item() < 1e-5
    assert (ours - _reference_logits(tmp_path, tokens, hf)).abs().max().item() > 1e-3  # the adapters matter

    # the base replaced by another import at the same path: the adapters are never merged into it or trained on it
    shutil.rmtree(base)
    make("llama", tmp_path / "hf2", vocab_size=320, seed=1)
    assert main(["convert", "hf-to-mcore", str(tmp_path / "hf2"), str(base), "recipe=tiny_llama_sft"]) == 0
    assert main(["convert", "mcore-to-hf", str(step6), str(tmp_path / "wrong_hf")]) == 2
    assert not (tmp_path / "wrong_hf").exists()
    (ckpts / "latest_committed.txt").write_text("3\n")
    code, out, _ = run("--resume", str(run_dir), "--nproc", "2")
    assert code == exitcodes.BAD_CKPT, out[-3000:]
    assert "is not the base the LoRA adapters" in (run_dir / "logs" / "train.log").read_text()

    pytest.importorskip("peft")
    through_peft = _reference_logits(tmp_path, tokens, hf, tmp_path / "ad2")
    assert (through_peft - reference).abs().max().item() < 1e-5
