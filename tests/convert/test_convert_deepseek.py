"""A tiny random ``DeepseekV3ForCausalLM`` (transformers' own config class, no download) goes through ``convert
hf-to-mcore`` without a recipe and back bit-identically (expert biases and the dense/MoE layer pattern
included), and the Megatron-Core model's logits equal transformers' at TP1, TP2 and EP2."""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch
from tiny_hf import (
    TOLERANCE,
    assert_logits_match,
    convert_output,
    forward_plan,
    hf_config,
    hf_tensors,
    make,
    model_class,
    round_trip,
    run_forward,
)

from kilocard.convert.families.deepseek_v3 import YARN_FIELDS

#: Also run on every other supported megatron-core release (scripts/test.sh, second pass).
pytestmark = pytest.mark.mcore_range

QUERY_NORM_FUSED = importlib.util.find_spec("megatron.core.transformer.mla_qk_norm_config") is not None
"""Whether the installed megatron-core (0.19 on) refuses ``q_lora_rank: null`` (``check_query_projection``)."""


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    return round_trip("deepseek_v3", tmp_path_factory.mktemp("deepseek"))


def test_the_import_derives_the_model_and_the_export_is_bit_identical(converted) -> None:
    root, model = converted
    saved = json.loads((root / "ck" / "step_0000000" / "trainer_state.json").read_text())["model"]
    assert (saved["moe_layer_freq"], saved["moe_router_num_groups"], saved["moe_router_group_topk"]) == (
        [0, 1, 1],
        2,
        1,
    )
    assert (saved["multi_latent_attention"], saved["moe_router_enable_expert_bias"], saved["mtp_num_layers"]) == (
        True,
        True,
        None,
    )
    original, back = hf_tensors(root / "hf"), hf_tensors(root / "back")
    assert set(back) == set(original)
    assert "model.layers.1.mlp.gate.e_score_correction_bias" in back
    assert all(torch.equal(back[k], original[k]) for k in original), [
        k for k in original if not torch.equal(back[k], original[k])
    ]
    reloaded = model_class("deepseek_v3").from_pretrained(root / "back").eval()
    tokens = torch.randint(0, 258, (1, 12), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert torch.equal(reloaded(tokens).logits, model(tokens).logits)


@pytest.mark.slow
def test_forward_matches_transformers_in_tp1_tp2_ep2(converted, tmp_path) -> None:
    root, model = converted
    layouts = [("deepseek_v3", "ck", 1, 1, 1), ("deepseek_v3", "ck", 2, 1, 1), ("deepseek_v3", "ck", 1, 1, 2)]
    plan = forward_plan(root, tmp_path, {"deepseek_v3": model}, layouts)
    out = run_forward(plan, tmp_path)
    assert_logits_match(plan, out, TOLERANCE)


@pytest.mark.slow  # trains a step
def test_an_export_of_a_trained_model_with_mtp_writes_the_mtp_layer_and_imports_back(kilocard_run, tmp_path) -> None:
    """A trained model's MTP layer is written where DeepSeek's own checkpoints keep it (``model.layers.{L}.*``,
    ``num_nextn_predict_layers``: transformers loads the folder and ignores it), and an import without a recipe
    takes it back: the trained MTP weights survive a round trip through Hugging Face's layout."""
    import subprocess
    import sys

    code, out, run_dir = kilocard_run("recipe=tiny_deepseek_v3", "trainer.train_iters=1", "optim.lr_warmup_iters=0")
    assert code == 0, out[-3000:]
    cmd = [sys.executable, "-W", "ignore", "-m", "kilocard.cli", "convert", "mcore-to-hf", str(run_dir / "checkpoints")]
    proc = subprocess.run([*cmd, str(tmp_path / "hf")], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1 and "dropped" not in lines[0], lines
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert (config["num_nextn_predict_layers"], config["first_k_dense_replace"], config["n_group"]) == (1, 1, 2)
    exported = hf_tensors(tmp_path / "hf")
    assert {"model.layers.4.eh_proj.weight", "model.layers.4.mlp.gate.e_score_correction_bias"} <= set(exported)
    assert torch.equal(exported["model.layers.4.shared_head.head.weight"], exported["lm_head.weight"])
    model_class("deepseek_v3").from_pretrained(tmp_path / "hf")
    codes, said = convert_output(
        ["hf-to-mcore", str(tmp_path / "hf"), str(tmp_path / "ck")],
        ["mcore-to-hf", str(tmp_path / "ck"), str(tmp_path / "back")],
    )
    assert codes == [0, 0], said
    saved = json.loads((tmp_path / "ck" / "step_0000000" / "trainer_state.json").read_text())["model"]
    assert saved["mtp_num_layers"] == 1
    back = hf_tensors(tmp_path / "back")
    assert set(back) == set(exported) and all(torch.equal(back[k], exported[k]) for k in exported)


YARN = {
    "rope_type": "yarn",
    "rope_theta": 100.0,
    "factor": 4.0,
    "original_max_position_embeddings": 4,
    "beta_fast": 0.5,
    "beta_slow": 0.05,
    "mscale": 0.8,
    "mscale_all_dim": 0.6,
}
"""YaRN over a 4-token original context (the 16-token test batch runs past it), its correction range set so the
8 rotary dimensions are extrapolated, ramped and interpolated, and distinct nonzero ``mscale``/``mscale_all_dim``:
both scale the rotary cos/sin (their ratio) and ``mscale_all_dim`` the softmax too (squared)."""

SHARP = 0.1
"""``initializer_range`` of the variants' weights: at transformers' 0.02 the tiny model's attention is nearly uniform
and its logits move by only 4e-4 without YaRN's softmax scale; at 0.1 by 0.2 (``test_the_yarn_twin_depends...``)."""

YARN_TWIN = {"rope_parameters": YARN, "max_position_embeddings": 16}
"""The YaRN twin's config changes (a 16-token context: 4 x the original 4)."""

KIMI_ROPE = {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4, "beta_fast": 1.0,
             "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0}  # fmt: skip
"""Kimi-K2's ``rope_scaling`` (beta 1/1, mscale 1/1; factor 32 over 4096 in the published file), in the older
spelling its ``config.json`` uses, over the tiny twin's context."""


def kimi_folder(path):
    """A tiny DeepSeek-V3 folder rewritten as Kimi-K2's own ``config.json`` says it: ``model_type: kimi_k2``, remote
    code in ``auto_map`` (absent here: kilocard must never need it), ``rope_theta`` and ``rope_scaling`` at the top
    level, no expert groups; the weights are ``DeepseekV3ForCausalLM``'s. Returns that model."""
    rope = {**KIMI_ROPE, "rope_type": "yarn", "rope_theta": 5e4}
    model = make("deepseek_v3", path, seed=2, n_group=1, topk_group=1, max_position_embeddings=16,
                 initializer_range=SHARP, rope_parameters=rope)  # fmt: skip
    config = json.loads((path / "config.json").read_text())
    del config["rope_parameters"]
    config.update(model_type="kimi_k2", rope_theta=5e4, rope_scaling=KIMI_ROPE)
    config["auto_map"] = {"AutoConfig": "configuration_deepseek.DeepseekV3Config"}
    (path / "config.json").write_text(json.dumps(config))
    return model


@pytest.fixture(scope="module")
def variants(tmp_path_factory):
    """Three imports without a recipe and their exports: ``q_lora_rank: null`` (the query projected directly),
    YaRN, and Kimi-K2's own ``config.json``."""
    root = tmp_path_factory.mktemp("deepseek_variants")
    models = {
        "yarn": make("deepseek_v3", root / "hf_yarn", seed=3, initializer_range=SHARP, **YARN_TWIN),
        "kimi": kimi_folder(root / "hf_kimi"),
    }
    if not QUERY_NORM_FUSED:
        models["qproj"] = make("deepseek_v3", root / "hf_qproj", seed=1, q_lora_rank=None, initializer_range=SHARP)
    args = [["hf-to-mcore", str(root / f"hf_{k}"), str(root / f"ck_{k}")] for k in models]
    args += [["mcore-to-hf", str(root / f"ck_{k}"), str(root / f"back_{k}")] for k in models]
    codes, lines = convert_output(*args)
    assert codes == [0] * len(args), lines
    return root, models, lines


@pytest.mark.skipif(not QUERY_NORM_FUSED, reason="megatron-core 0.16 imports q_lora_rank null (the tests above)")
def test_q_lora_rank_null_is_refused_in_one_line_where_megatron_core_adds_a_query_norm(tmp_path) -> None:
    """From megatron-core 0.19 ``qk_layernorm`` without a query latent normalises ``linear_q_proj``'s input (a fused
    norm DeepSeek-V2-Lite has not): the import is refused in one line and leaves nothing behind."""
    make("deepseek_v3", tmp_path / "hf", q_lora_rank=None)
    codes, lines = convert_output(["hf-to-mcore", str(tmp_path / "hf"), str(tmp_path / "ck")])
    assert codes == [1] and not (tmp_path / "ck").exists(), lines  # exit 1: a model kilocard cannot build
    assert "model.q_lora_rank: null with model.qk_layernorm=true: megatron-core 0.19" in lines[-1], lines


def saved_model(root, name: str) -> dict:
    return json.loads((root / f"ck_{name}" / "step_0000000" / "trainer_state.json").read_text())["model"]


def test_q_proj_yarn_and_kimi_k2_import_their_fields_and_export_bit_identically(variants) -> None:
    root, models, lines = variants
    assert QUERY_NORM_FUSED or saved_model(root, "qproj")["q_lora_rank"] is None
    yarn = saved_model(root, "yarn")
    assert {k: v for k, v in yarn.items() if k in ("rope_type", "rotary_base", *YARN_FIELDS)} == {
        "rope_type": "yarn", "rotary_base": 100, "rotary_scaling_factor": 4.0, "original_max_position_embeddings": 4,
        "beta_fast": 0.5, "beta_slow": 0.05, "mscale": 0.8, "mscale_all_dim": 0.6,
    }  # fmt: skip
    kimi = saved_model(root, "kimi")
    assert (kimi["rope_type"], kimi["rotary_base"], kimi["moe_router_num_groups"]) == ("yarn", 50000, None)
    for name, model in models.items():
        original, back = hf_tensors(root / f"hf_{name}"), hf_tensors(root / f"back_{name}")
        assert set(back) == set(original), name
        assert all(torch.equal(back[k], original[k]) for k in original), name
        reloaded = model_class("deepseek_v3").from_pretrained(root / f"back_{name}").eval()
        tokens = torch.randint(0, 258, (1, 16), generator=torch.Generator().manual_seed(3))
        with torch.no_grad():
            assert torch.equal(reloaded(tokens).logits, model(tokens).logits), name
    assert QUERY_NORM_FUSED or "q_proj.weight" in " ".join(hf_tensors(root / "back_qproj"))
    exported = json.loads((root / "back_yarn" / "config.json").read_text())["rope_parameters"]
    assert exported == {**YARN, "rope_theta": 100.0}
    kimi_config = json.loads((root / "back_kimi" / "config.json").read_text())
    assert (kimi_config["model_type"], kimi_config["architectures"]) == ("deepseek_v3", ["DeepseekV3ForCausalLM"])
    said = [line for line in lines if "back_kimi" in line]
    assert len(said) == 1 and "dropped model_type kimi_k2 (written as deepseek_v3" in said[0], lines


def test_the_yarn_twin_depends_on_every_scale_the_logit_test_compares() -> None:
    """transformers' own logits move far past the tolerance when YaRN's softmax scale (``mscale_all_dim``), its
    cos/sin factor (``mscale``) or its frequencies (plain RoPE) are left out: the logit test below would see any."""
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as d:
        model = make("deepseek_v3", Path(d), seed=3, initializer_range=SHARP, **YARN_TWIN)
    tokens = torch.randint(0, 258, (2, 16), generator=torch.Generator().manual_seed(1))
    without = [
        {**YARN, "mscale_all_dim": 0.0, "mscale": 1.0},  # no softmax scale; cos/sin by mscale(4, 1) / 1
        {**YARN, "mscale": 0.6},  # cos/sin factor 1, the softmax still scaled
        {"rope_type": "default", "rope_theta": 100.0},
    ]
    with torch.no_grad():
        reference = model(tokens).logits
        for rope in without:
            config = hf_config("deepseek_v3", initializer_range=SHARP, **{**YARN_TWIN, "rope_parameters": rope})
            other = model_class("deepseek_v3")(config)
            other.load_state_dict(model.state_dict())
            assert (other.eval()(tokens).logits - reference).abs().max() > 100 * TOLERANCE, rope


@pytest.mark.slow
def test_q_proj_yarn_and_kimi_k2_logits_match_transformers_in_tp1_and_tp2(variants, tmp_path) -> None:
    root, models, _ = variants
    layouts = [(name, f"ck_{name}", tp, 1, 1) for name in models for tp in (1, 2)]
    plan = forward_plan(root, tmp_path, models, layouts)
    out = run_forward(plan, tmp_path)
    assert_logits_match(plan, out, TOLERANCE)
