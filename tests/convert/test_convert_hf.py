"""Hugging Face -> kilocard -> Hugging Face for Llama (GQA; Llama 3.1 RoPE scaling), Mixtral and Qwen2.

One module fixture makes the tiny random models with transformers (sharded safetensors), imports each
with ``kilocard convert hf-to-mcore`` and exports it again with ``mcore-to-hf``; the tests then check
the committed output, bit-identical export, the Megatron-Core forward pass in several layouts against
transformers, and a training run that starts from the imported weights.
"""

from __future__ import annotations

import json

import pytest
import torch
from tiny_hf import convert_all, forward_plan, hf_tensors, make, model_class, recipe_of, run_forward

from kilocard.rundir import checkpoint as ck
from kilocard.rundir import names

pytestmark = pytest.mark.integration  # converts real checkpoints: torch and transformers

KINDS = ("llama", "llama31", "mixtral", "qwen2")
TOLERANCE = 1e-4
"""Largest |logit difference| allowed between Megatron-Core and transformers in fp32."""


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """(root, {kind: transformers model}): hf_<kind>/ made, ck_<kind>/ imported, back_<kind>/ exported."""
    root = tmp_path_factory.mktemp("convert")
    models = {k: make(k, root / f"hf_{k}") for k in KINDS}
    codes = convert_all(
        *[["hf-to-mcore", str(root / f"hf_{k}"), str(root / f"ck_{k}"), *recipe_of(k)] for k in KINDS],
        *[["mcore-to-hf", str(root / f"ck_{k}"), str(root / f"back_{k}"), "--max-shard-size", "40KB"] for k in KINDS],
    )
    assert codes == [0] * (2 * len(KINDS))
    return root, models


def test_import_writes_a_committed_model_only_step(converted) -> None:
    root, _ = converted
    for kind in KINDS:
        ckpt = root / f"ck_{kind}"
        assert ck.latest_committed(ckpt) == 0
        ck.verify_step(ck.step_dir(ckpt, 0))
        state = json.loads((ck.step_dir(ckpt, 0) / names.STATE).read_text())
        assert state["extra"][names.MODEL_ONLY] is True
        assert state["step"] == 0 and state["model"]["name"] == f"tiny_{kind.removesuffix('31')}"
        assert not list(root.glob(".*partial*")), "a staging directory was left behind"


@pytest.mark.parametrize("kind", KINDS)
def test_export_is_bit_identical_and_transformers_loads_it(converted, kind) -> None:
    root, models = converted
    original, exported = hf_tensors(root / f"hf_{kind}"), hf_tensors(root / f"back_{kind}")
    assert sorted(exported) == sorted(original)
    for name, t in original.items():
        assert exported[name].dtype == t.dtype and torch.equal(exported[name], t), name
    assert (root / f"back_{kind}" / "model.safetensors.index.json").is_file()
    reloaded = model_class(kind).from_pretrained(root / f"back_{kind}").eval()
    tokens = torch.randint(0, 258, (2, 16), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert torch.equal(reloaded(tokens).logits, models[kind](tokens).logits)


LAYOUTS = [
    ("llama", 1, 1, 1),
    ("llama", 2, 1, 1),
    ("llama", 1, 2, 1),
    ("llama31", 2, 1, 1),
    ("mixtral", 1, 1, 2),
    ("mixtral", 1, 2, 1),
    ("qwen2", 2, 1, 1),
    ("qwen2", 1, 2, 1),
]
"""(kind, TP, PP, EP) on two CPU ranks; TP1 runs data-parallel over both."""


@pytest.mark.slow
def test_forward_matches_transformers_in_tp1_tp2_pp2_ep2(converted, tmp_path) -> None:
    root, models = converted
    plan = forward_plan(root, tmp_path, models, [(k, f"ck_{k}", tp, pp, ep) for k, tp, pp, ep in LAYOUTS])
    out = run_forward(plan, tmp_path)
    for case, (kind, *_) in zip(plan, LAYOUTS, strict=True):
        inv_freq = torch.load(out / f"{case['name']}.inv_freq.pt")
        torch.testing.assert_close(inv_freq, models[kind].model.rotary_emb.inv_freq, rtol=1e-6, atol=0)
        results = [json.loads(p.read_text()) for p in out.glob(f"{case['name']}.rank*.json")]
        assert results, f"{case['name']}: no rank reported logits"
        for r in results:
            assert r["shape"] == [2, 16, 258]
            assert r["max_abs_diff"] <= TOLERANCE, (case["name"], r)


@pytest.mark.slow
def test_a_run_from_the_import_starts_at_the_transformers_loss(converted, kilocard_run) -> None:
    from kilocard.config.compose import compose, to_run_config
    from kilocard.data.iterator import build_train_iterator

    root, models = converted
    overrides = [
        "recipe=tiny_llama",
        "trainer.train_iters=1",
        "trainer.micro_batch_size=2",
        "trainer.global_batch_size=2",
        "parallel.use_distributed_optimizer=true",  # its fp32 main copies must follow the imported weights
    ]
    code, out, run_dir = kilocard_run(*overrides, f"checkpoint.load={root / 'ck_llama'}", "--nproc", "1")
    assert code == 0, out[-3000:]
    assert "started from the model weights" in (run_dir / "logs" / "train.log").read_text()
    first = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[0])
    batch = next(
        build_train_iterator(
            to_run_config(compose(overrides)),
            dp_rank=0,
            dp_size=1,
            cache_dir=str(run_dir / "data_cache"),
            create_attention_mask=False,
        )
    )
    with torch.no_grad():
        logits = models["llama"](batch["tokens"]).logits.float()
    per_token = torch.nn.functional.cross_entropy(logits.transpose(1, 2), batch["labels"], reduction="none")
    mask = batch["loss_mask"].float()
    expected = (per_token * mask).sum() / mask.sum()
    assert first["step"] == 1
    assert abs(first["loss"] - expected.item()) <= TOLERANCE, (first["loss"], expected.item())
    # the trained step (a trainer checkpoint, optimizer state and all) exports, and transformers loads it
    assert convert_all(["mcore-to-hf", str(run_dir / "checkpoints"), str(run_dir / "hf")]) == [0]
    trained = model_class("llama").from_pretrained(run_dir / "hf").eval()
    before = models["llama"].state_dict()
    changed = [n for n, t in trained.state_dict().items() if not torch.equal(t, before[n])]
    assert "model.layers.0.self_attn.q_proj.weight" in changed
    # one Adam step moves a weight by about the learning rate; from a fresh init it would be ~0.1 away
    drift = max((t - before[n]).abs().max().item() for n, t in trained.state_dict().items())
    assert drift < 0.01, drift


@pytest.mark.slow
def test_a_bf16_run_from_the_import_trains_the_imported_weights(tmp_path, kilocard_run) -> None:
    """bf16 keeps fp32 main copies in the optimizer: they must be refreshed from the imported weights."""
    original = make("llama", tmp_path / "hf", dtype=torch.bfloat16)
    bf16 = ["precision=bf16", "parallel.use_distributed_optimizer=true"]
    assert convert_all(
        ["hf-to-mcore", str(tmp_path / "hf"), str(tmp_path / "ck"), "recipe=tiny_llama", *bf16],
        ["mcore-to-hf", str(tmp_path / "ck"), str(tmp_path / "back")],
    ) == [0, 0]
    back, before = hf_tensors(tmp_path / "back"), original.state_dict()
    for name, t in back.items():  # bf16 in, bf16 out, bit for bit
        assert t.dtype == torch.bfloat16 and torch.equal(t, before[name]), name
    code, out, run_dir = kilocard_run(
        "recipe=tiny_llama", *bf16, "trainer.train_iters=1", f"checkpoint.load={tmp_path / 'ck'}", "--nproc", "1"
    )
    assert code == 0, out[-3000:]
    assert convert_all(["mcore-to-hf", str(run_dir / "checkpoints"), str(tmp_path / "trained")]) == [0]
    trained = hf_tensors(tmp_path / "trained")
    assert trained["model.norm.weight"].dtype == torch.bfloat16
    drift = max((t.float() - before[n].float()).abs().max().item() for n, t in trained.items())
    assert 0 < drift < 0.02, drift  # a step from the import, not from a fresh init (~0.1 away)
