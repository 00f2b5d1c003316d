"""``kilocard convert hf-to-mcore DIR OUT`` without a recipe: the model is derived from ``config.json``
(Llama, Llama 3.1 RoPE scaling, Mixtral, Qwen2), as Megatron-Bridge's AutoBridge does, and ``model.yaml`` and
``recipe.yaml`` are written beside the checkpoint; that recipe composes, validates and loads the weights.

The tiny Hugging Face models are made with transformers (tests/convert/tiny_hf.py); their twins, the tiny
recipes, are the reference: the derived model must have every shape field the matching recipe has.
"""

from __future__ import annotations

import json

import pytest
import yaml
from tiny_hf import convert_all, make, recipe_of

from kilocard.config.compose import compose, to_run_config
from kilocard.rundir import checkpoint as ck
from kilocard.rundir import names
from kilocard.validate import validate

pytestmark = pytest.mark.slow  # builds a Megatron-Core model per import, in one fresh interpreter

KINDS = ("llama", "llama31", "mixtral", "qwen2")
SHAPE = ("num_layers", "hidden_size", "num_attention_heads", "num_query_groups", "vocab_size", "layernorm_epsilon",
         "share_embeddings_and_output_weights", "rotary_base", "rope_scaling", "add_qkv_bias")  # fmt: skip


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    root = tmp_path_factory.mktemp("autobridge")
    for kind in KINDS:
        make(kind, root / f"hf_{kind}")
    codes = convert_all(*[["hf-to-mcore", str(root / f"hf_{k}"), str(root / f"ck_{k}")] for k in KINDS])
    assert codes == [0] * len(KINDS)
    return root


@pytest.mark.parametrize("kind", KINDS)
def test_the_model_comes_from_config_json(imported, kind):
    ckpt = imported / f"ck_{kind}"
    ck.verify_step(ck.step_dir(ckpt, 0))
    model = yaml.safe_load((ckpt / "model.yaml").read_text())
    twin = to_run_config(compose(recipe_of(kind))).model
    for field in SHAPE:
        assert model[field] == getattr(twin, field), field
    assert model["name"] == f"ck_{kind}"
    ffn = "moe_ffn_hidden_size" if kind == "mixtral" else "ffn_hidden_size"
    assert model[ffn] == getattr(twin, ffn)
    state = json.loads((ck.step_dir(ckpt, 0) / names.STATE).read_text())
    assert state["extra"]["source"]["family"] == kind.removesuffix("31") and state["model"] == model


@pytest.mark.parametrize("kind", KINDS)
def test_the_written_recipe_composes_validates_and_starts_from_the_weights(imported, kind):
    ckpt = imported / f"ck_{kind}"
    cfg = to_run_config(compose([f"recipe={ckpt / 'recipe.yaml'}"]))
    assert cfg.checkpoint.load == str(ckpt) and cfg.recipe.name == f"ck_{kind}" and cfg.cluster.name == "local_cpu"
    assert cfg.model == to_run_config(compose([f"recipe={ckpt / 'recipe.yaml'}"])).model
    report = validate(cfg)
    assert report.valid, [i.message for i in report.issues]
