"""A tiny random ``GptOssForCausalLM`` (transformers' own config class, no download) goes through ``convert
hf-to-mcore`` without a recipe and back bit-identically (sinks, biases and the fused, interleaved experts
included), and the Megatron-Core model's logits equal transformers' at TP1, TP2 (expert TP 1) and EP2, with an
8-token window on every other layer of a 16-token batch; the same with YaRN (``position_embedding_type: yarn``)."""

from __future__ import annotations

import json

import pytest
import torch
from tiny_hf import TOLERANCE, assert_logits_match, forward_plan, hf_tensors, model_class, round_trip, run_forward

#: Also run on every other supported megatron-core release (scripts/test.sh, second pass).
pytestmark = pytest.mark.mcore_range


YARN = {"rope_type": "yarn", "rope_theta": 150000.0, "factor": 4.0, "original_max_position_embeddings": 4096}
"""GPT-OSS's YaRN at factor 4 (with ``truncate: false``): its correction range, dimensions 2.0 to 4.3 of 8, is
not whole. With weights of std 0.2 (the attention sharp enough to feel positions in 16 tokens) the logits move by
2.3 with plain RoPE or without YaRN's temperature, and by 0.04 with the range rounded."""
YARN_MODEL = dict(rope_parameters={**YARN, "truncate": False}, max_position_embeddings=16384, initializer_range=0.2)


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    root, model = round_trip("gpt_oss", tmp_path_factory.mktemp("gpt_oss"))
    _, yarn = round_trip("gpt_oss", root, "yarn_", **YARN_MODEL)
    return root, model, yarn


def test_the_import_derives_the_model_and_the_export_is_bit_identical(converted) -> None:
    root, model, _ = converted
    saved = json.loads((root / "ck" / "step_0000000" / "trainer_state.json").read_text())["model"]
    # transformers' 8-token window (the query included) is Megatron-Core's 7 tokens before the query
    assert (saved["window_size"], saved["window_attn_skip_freq"], saved["softmax_type"]) == ([7, 0], 2, "learnable")
    assert (saved["activation"], saved["glu_linear_offset"], saved["activation_func_clamp_value"]) == (
        "quick_gelu",
        1.0,
        0.3,
    )
    assert (saved["num_moe_experts"], saved["moe_router_topk"], saved["moe_ffn_hidden_size"]) == (4, 2, 32)
    original, back = hf_tensors(root / "hf"), hf_tensors(root / "back")
    assert set(back) == set(original)
    assert "model.layers.1.self_attn.sinks" in back and "model.layers.1.mlp.experts.gate_up_proj_bias" in back
    assert all(torch.equal(back[k], original[k]) for k in original), [
        k for k in original if not torch.equal(back[k], original[k])
    ]
    config = json.loads((root / "back" / "config.json").read_text())
    assert (config["sliding_window"], config["layer_types"][:2]) == (8, ["sliding_attention", "full_attention"])
    reloaded = model_class("gpt_oss").from_pretrained(root / "back").eval()
    tokens = torch.randint(0, 258, (1, 12), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert torch.equal(reloaded(tokens).logits, model(tokens).logits)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {"rope_parameters": {**YARN, "attention_factor": 1.5}},
            "rope_parameters.attention_factor is 1.5; Megatron-Core's YaRN derives the cos/sin factor",
        ),
        (
            {"rope_parameters": {"rope_type": "default"}, "quantization_config": {"quant_method": "mxfp4"}},
            "quantization_config has quant_method 'mxfp4'; kilocard imports unquantized weights only",
        ),
    ],
)
def test_what_the_family_cannot_hold_is_refused_by_name(tmp_path, capsys, changes, message) -> None:
    """The published checkpoints' MXFP4 experts and a YaRN temperature given outright: one line each, before any
    tensor is read, and nothing written."""
    from kilocard import cli

    config = {**model_class("gpt_oss").config_class().to_dict(), **changes}
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text(json.dumps(config))
    code = cli.main(["convert", "hf-to-mcore", str(tmp_path / "hf"), str(tmp_path / "ck")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1 and message in err[0], err
    assert not (tmp_path / "ck").exists()


def test_yarn_imports_as_megatron_cores_and_exports_as_it_came(converted) -> None:
    root, _, yarn = converted
    saved = json.loads((root / "yarn_ck" / "step_0000000" / "trainer_state.json").read_text())["model"]
    fields = ("position_embedding_type", "rotary_scaling_factor", "original_max_position_embeddings", "beta_fast")
    assert [saved[f] for f in fields] == ["yarn", 4.0, 4096, 32.0]
    assert (saved["beta_slow"], saved["mscale"], saved["mscale_all_dim"]) == (1.0, 1.0, 0.0)
    assert saved["yarn_correction_range_round_to_int"] is False
    back = json.loads((root / "yarn_back" / "config.json").read_text())["rope_parameters"]
    defaults = {"beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 0.0}  # written out
    assert back == {**YARN, "truncate": False, **defaults}
    original, exported = hf_tensors(root / "yarn_hf"), hf_tensors(root / "yarn_back")
    assert set(exported) == set(original) and all(torch.equal(exported[k], original[k]) for k in original)


def test_the_published_config_derives_gpt_oss_120b() -> None:
    """``GptOssConfig()`` is GPT-OSS 120B's ``config.json``: YaRN x32 from 4096 without rounding, a 128-token
    window (127 before the query) on every other layer, 128 experts, top-4, SwiGLU clamped at 7."""
    from kilocard.convert import maps

    m = maps.model_from_config(model_class("gpt_oss").config_class().to_dict(), "gpt_oss")
    assert (m["num_layers"], m["num_moe_experts"], m["moe_router_topk"], m["moe_ffn_hidden_size"]) == (36, 128, 4, 2880)
    assert (m["window_size"], m["window_attn_skip_freq"], m["activation_func_clamp_value"]) == ([127, 0], 2, 7.0)
    assert (m["position_embedding_type"], m["rotary_scaling_factor"], m["original_max_position_embeddings"]) == (
        "yarn",
        32.0,
        4096,
    )
    assert (m["yarn_correction_range_round_to_int"], m["rotary_base"], m["seq_length"]) == (False, 150000, 8192)


@pytest.mark.slow
def test_forward_matches_transformers_in_tp1_tp2_ep2(converted, tmp_path) -> None:
    root, model, yarn = converted
    layouts = [("gpt_oss", "ck", 1, 1, 1), ("gpt_oss", "ck", 2, 1, 1), ("gpt_oss", "ck", 1, 1, 2)]
    layouts += [("yarn", "yarn_ck", 1, 1, 1), ("yarn", "yarn_ck", 1, 1, 2)]
    plan = forward_plan(root, tmp_path, {"gpt_oss": model, "yarn": yarn}, layouts)
    plan[1]["etp"] = 1  # Megatron-Core splits no expert bias over TP (docs/huggingface.md)
    out = run_forward(plan, tmp_path)
    assert_logits_match(plan, out, TOLERANCE)
