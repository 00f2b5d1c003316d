"""A tiny random ``GptOssForCausalLM`` (transformers' own config class, no download) goes through ``convert
hf-to-mcore`` without a recipe and back bit-identically (sinks, biases and the fused, interleaved experts
included), and the Megatron-Core model's logits equal transformers' at TP1, TP2 (expert TP 1) and EP2, with an
8-token window on every other layer of a 16-token batch."""

from __future__ import annotations

import json

import pytest
import torch
from tiny_hf import TOLERANCE, assert_logits_match, forward_plan, hf_tensors, model_class, round_trip, run_forward

#: Also run on every other supported megatron-core release (scripts/test.sh, second pass).
pytestmark = pytest.mark.mcore_range


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    return round_trip("gpt_oss", tmp_path_factory.mktemp("gpt_oss"))


def test_the_import_derives_the_model_and_the_export_is_bit_identical(converted) -> None:
    root, model = converted
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
        ({}, "rope_parameters.rope_type is 'yarn'; kilocard's gpt_oss model has plain RoPE only"),
        (
            {"rope_parameters": {"rope_type": "default"}, "quantization_config": {"quant_method": "mxfp4"}},
            "quantization_config has quant_method 'mxfp4'; kilocard imports unquantized weights only",
        ),
    ],
)
def test_yarn_and_quantized_checkpoints_are_refused_by_name(tmp_path, capsys, changes, message) -> None:
    """``GptOssConfig``'s default RoPE is YaRN, the published checkpoints' experts are MXFP4: one line each,
    before any tensor is read, and nothing written."""
    from kilocard import cli

    config = {**model_class("gpt_oss").config_class().to_dict(), **changes}
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text(json.dumps(config))
    code = cli.main(["convert", "hf-to-mcore", str(tmp_path / "hf"), str(tmp_path / "ck")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1 and message in err[0], err
    assert not (tmp_path / "ck").exists()


@pytest.mark.slow
def test_forward_matches_transformers_in_tp1_tp2_ep2(converted, tmp_path) -> None:
    root, model = converted
    layouts = [("gpt_oss", "ck", 1, 1, 1), ("gpt_oss", "ck", 2, 1, 1), ("gpt_oss", "ck", 1, 1, 2)]
    plan = forward_plan(root, tmp_path, {"gpt_oss": model}, layouts)
    plan[1]["etp"] = 1  # Megatron-Core splits no expert bias over TP (docs/huggingface.md)
    out = run_forward(plan, tmp_path)
    assert_logits_match(plan, out, TOLERANCE)
