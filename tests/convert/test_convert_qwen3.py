"""Qwen3 dense and Qwen3-MoE in and out of Hugging Face: tiny random ``Qwen3ForCausalLM`` / ``Qwen3MoeForCausalLM``
made by transformers' own config classes (tests/convert/tiny_hf.py), imported with the tiny recipes and without
a recipe (the model derived from ``config.json``), exported again, and run by Megatron-Core at TP1, TP2 and
(MoE) EP2 against transformers' logits. Also run on megatron-core 0.19.2 (marker ``mcore_range``).

The ``norm_topk_prob: false`` variant checks the other router mapping (softmax over every expert before the
top-k: ``moe_router_pre_softmax: true``); the published Qwen3-MoE models renormalise (``false``).
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch
import yaml
from tiny_hf import assert_logits_match, convert_all, forward_plan, hf_tensors, make, model_class, run_forward

from kilocard.config.compose import compose, to_run_config
from kilocard.paths import data_dir

pytestmark = [pytest.mark.integration, pytest.mark.mcore_range]

TOLERANCE = 1e-4
"""Largest |logit difference| allowed between Megatron-Core and transformers in fp32 (the other families')."""
CHAT = data_dir("conf").parent / "data" / "tiny_chat"
MODELS = {"qwen3": ("qwen3", {}), "qwen3_moe": ("qwen3_moe", {}), "plain": ("qwen3_moe", {"norm_topk_prob": False})}
"""Test model name: (tiny_hf kind, config changes)."""


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """(root, {name: transformers model}): hf_<name>/ made; ck_<kind>/ imported with recipe tiny_<kind>,
    auto_<name>/ without a recipe; back_<kind>/ and autoback_<name>/ their exports."""
    root = tmp_path_factory.mktemp("qwen3")
    models = {n: make(kind, root / f"hf_{n}", seed=i, **ch) for i, (n, (kind, ch)) in enumerate(MODELS.items())}
    for name in ("tokenizer.json", "tokenizer_config.json"):  # the shipped chat tokenizer, template and all
        shutil.copy(CHAT / name, root / "hf_qwen3" / name)
    kinds = ("qwen3", "qwen3_moe")
    codes = convert_all(
        *[["hf-to-mcore", str(root / f"hf_{k}"), str(root / f"ck_{k}"), f"recipe=tiny_{k}"] for k in kinds],
        *[["hf-to-mcore", str(root / f"hf_{n}"), str(root / f"auto_{n}")] for n in MODELS],
        *[["mcore-to-hf", str(root / f"ck_{k}"), str(root / f"back_{k}"), "--max-shard-size", "40KB"] for k in kinds],
        *[["mcore-to-hf", str(root / f"auto_{n}"), str(root / f"autoback_{n}")] for n in MODELS],
    )
    assert codes == [0] * (2 * len(kinds) + 2 * len(MODELS))
    return root, models


@pytest.mark.parametrize(
    "out", ["back_qwen3", "back_qwen3_moe", "autoback_qwen3", "autoback_qwen3_moe", "autoback_plain"]
)
def test_a_round_trip_is_bit_identical_and_transformers_loads_it(converted, out) -> None:
    root, models = converted
    name = out.split("_", 1)[1]
    original, exported = hf_tensors(root / f"hf_{name}"), hf_tensors(root / out)
    assert sorted(exported) == sorted(original)
    for key, t in original.items():
        assert exported[key].dtype == t.dtype and torch.equal(exported[key], t), key
    kind = MODELS[name][0]
    config = json.loads((root / out / "config.json").read_text())
    assert config["architectures"] == [model_class(kind).__name__] and config["model_type"] == kind
    reloaded = model_class(kind).from_pretrained(root / out).eval()
    tokens = torch.randint(0, 258, (2, 16), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert torch.equal(reloaded(tokens).logits, models[name](tokens).logits)


DERIVED = ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_query_groups", "kv_channels",
           "vocab_size", "layernorm_epsilon", "share_embeddings_and_output_weights", "rotary_base", "add_qkv_bias",
           "qk_layernorm", "num_moe_experts", "moe_router_topk", "moe_ffn_hidden_size", "moe_router_pre_softmax",
           "moe_aux_loss_coeff", "normalization", "activation")  # fmt: skip


@pytest.mark.parametrize("name", list(MODELS))
def test_without_a_recipe_the_model_is_the_tiny_recipes(converted, name) -> None:
    root, _ = converted
    kind = MODELS[name][0]
    derived = yaml.safe_load((root / f"auto_{name}" / "model.yaml").read_text())
    recipe = to_run_config(compose([f"recipe=tiny_{kind}"])).model
    want = {f: getattr(recipe, f) for f in DERIVED}
    if name == "plain":  # norm_topk_prob false: the softmax over every expert, before the top-k
        want["moe_router_pre_softmax"] = True
    assert {f: derived[f] for f in DERIVED} == want
    run = to_run_config(compose([f"recipe={root / f'auto_{name}' / 'recipe.yaml'}"]))
    assert run.checkpoint.load == str((root / f"auto_{name}").resolve())


def test_the_tokenizer_and_chat_template_come_back(converted) -> None:
    root, _ = converted
    source = json.loads((CHAT / "tokenizer_config.json").read_text())
    for out in ("back_qwen3", "autoback_qwen3"):
        assert (root / out / "tokenizer.json").read_bytes() == (CHAT / "tokenizer.json").read_bytes()
        exported = json.loads((root / out / "tokenizer_config.json").read_text())
        assert exported.get("chat_template") == source.get("chat_template") is not None


LAYOUTS = [
    ("qwen3", "ck_qwen3", 1, 1, 1),
    ("qwen3", "ck_qwen3", 2, 1, 1),
    ("qwen3_moe", "ck_qwen3_moe", 1, 1, 1),
    ("qwen3_moe", "ck_qwen3_moe", 2, 1, 1),
    ("qwen3_moe", "ck_qwen3_moe", 1, 1, 2),
    ("qwen3_moe", "auto_qwen3_moe", 1, 1, 2),
    ("plain", "auto_plain", 1, 1, 1),
    ("plain", "auto_plain", 1, 1, 2),
]
"""(model, checkpoint, TP, PP, EP) on two CPU ranks; TP1 EP1 runs data-parallel over both."""


@pytest.mark.slow
def test_logits_equal_transformers_at_tp1_tp2_and_ep2(converted, tmp_path) -> None:
    root, models = converted
    plan = forward_plan(root, tmp_path, models, LAYOUTS)
    out = run_forward(plan, tmp_path)
    assert_logits_match(plan, out, TOLERANCE)
