"""DeepSeek-V3 as its hub checkpoint stores it: linear weights in block-scaled FP8 (``float8_e4m3fn`` beside a
``weight_scale_inv`` per block, ``quantization_config`` saying the block size). A tiny random
``DeepseekV3ForCausalLM`` is rewritten that way by the test; ``convert hf-to-mcore`` without a recipe dequantizes it,
and the Megatron-Core logits equal transformers' of the model the test dequantizes on its own. And its MTP layer
(``model.layers.{num_hidden_layers}.*``, which transformers' model has not): it lands bit-identical in Megatron-Core's
MTP block and is exported back under the same names, or is left out, and said so, in a model without MTP."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import save_file
from tiny_hf import TOLERANCE, assert_logits_match, convert_output, forward_plan, hf_tensors, make, model_class
from tiny_hf import run_forward as run_forward_plan

#: Also run on every other supported megatron-core release (scripts/test.sh, second pass).
pytestmark = pytest.mark.mcore_range

BLOCK = (16, 24)
"""The test's ``weight_block_size``: not square, so rows and columns cannot be swapped unseen, and neither divides
every dimension (``kv_a_proj_with_mqa``'s 24 rows, the 64 columns of most weights): edge blocks are cut short."""
QUANT = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8", "weight_block_size": list(BLOCK)}
"""``quantization_config`` as DeepSeek-V3's ``config.json`` has it, but for the block size."""
FP8_MAX = 448.0


def quantized(name: str, t: torch.Tensor) -> bool:
    """Whether the hub checkpoint stores ``name`` in FP8: the 2-d projections (not the embedding, the output
    layer, the router or the norms)."""
    return t.dim() == 2 and "_proj" in name


def blocks(t: torch.Tensor):
    """``(i, j, view)`` for every ``BLOCK`` of ``t``, the last ones cut short."""
    for i in range(0, t.shape[0], BLOCK[0]):
        for j in range(0, t.shape[1], BLOCK[1]):
            yield i // BLOCK[0], j // BLOCK[1], t[i : i + BLOCK[0], j : j + BLOCK[1]]


def quantize(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``t`` as FP8 and its per-block ``scale_inv`` (block max -> 448)."""
    rows, cols = -(-t.shape[0] // BLOCK[0]), -(-t.shape[1] // BLOCK[1])
    scale = torch.zeros(rows, cols)
    q = torch.zeros_like(t, dtype=torch.float8_e4m3fn)
    for i, j, part in blocks(t):
        scale[i, j] = part.abs().max().clamp(min=1e-12) / FP8_MAX
        q[i * BLOCK[0] : i * BLOCK[0] + part.shape[0], j * BLOCK[1] : j * BLOCK[1] + part.shape[1]] = (
            part / scale[i, j]
        ).to(torch.float8_e4m3fn)
    return q, scale


def dequantize(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """The test's own dequantization, block by block."""
    out = torch.zeros(q.shape)
    for i, j, part in blocks(q):
        out[i * BLOCK[0] : i * BLOCK[0] + part.shape[0], j * BLOCK[1] : j * BLOCK[1] + part.shape[1]] = (
            part.float() * scale[i, j]
        )
    return out


def rewrite(folder, tensors: dict[str, torch.Tensor], quant: dict | None) -> None:
    """``folder``'s weights replaced by ``tensors`` in two shards (the scales in the second, away from their
    weights), its ``config.json`` given ``quantization_config`` ``quant``."""
    for f in [*folder.glob("*.safetensors"), folder / "model.safetensors.index.json"]:
        f.unlink(missing_ok=True)
    scales = {k for k in tensors if k.endswith("_scale_inv")}
    shards = {"model-00001-of-00002.safetensors": sorted(set(tensors) - scales)}
    shards["model-00002-of-00002.safetensors"] = sorted(scales)
    for fname, names in shards.items():
        save_file({n: tensors[n].contiguous() for n in names}, str(folder / fname), metadata={"format": "pt"})
    index = {"metadata": {}, "weight_map": {n: f for f, names in shards.items() for n in names}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    config = json.loads((folder / "config.json").read_text())
    config.pop("quantization_config", None)
    (folder / "config.json").write_text(json.dumps({**config, **({"quantization_config": quant} if quant else {})}))


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    """``hf``: the tiny model's FP8 hub form; ``ref``: the same weights the test dequantized, unquantized (the
    transformers reference); ``bad``: one scale of the wrong shape; ``other``: another quantization method. The
    first is imported (and exported), the last two refused."""
    root = tmp_path_factory.mktemp("deepseek_hub")
    make("deepseek_v3", root / "hf", seed=5, initializer_range=0.1)
    shutil.copytree(root / "hf", root / "ref")
    original = hf_tensors(root / "hf")
    stored, plain = {}, {}
    for name, t in original.items():
        if not quantized(name, t):  # bf16, as the hub checkpoints store what they do not quantize
            stored[name] = t.to(torch.bfloat16)
            plain[name] = stored[name].float()
            continue
        stored[name], stored[name + "_scale_inv"] = quantize(t)
        plain[name] = dequantize(stored[name], stored[name + "_scale_inv"])
    assert sum(k.endswith("_scale_inv") for k in stored) == 3 * 5 + 3 + 2 * (4 * 3 + 3)  # attention, MLP, MoE
    rewrite(root / "hf", stored, QUANT)
    rewrite(root / "ref", plain, None)
    for name in ("bad", "other"):
        shutil.copytree(root / "hf", root / name)
    bad = dict(stored, **{"model.layers.1.self_attn.kv_a_proj_with_mqa.weight_scale_inv": torch.ones(1, 3)})
    rewrite(root / "bad", bad, QUANT)
    rewrite(root / "other", stored, {"quant_method": "bitsandbytes"})
    reference = model_class("deepseek_v3").from_pretrained(root / "ref").eval()
    args = [["hf-to-mcore", str(root / n), str(root / f"ck_{n}")] for n in ("hf", "bad", "other")]
    args += [["mcore-to-hf", str(root / "ck_hf"), str(root / "back")]]
    codes, lines = convert_output(*args, ["hf-to-mcore", str(root / "hf"), str(root / "ck_bf16"), "precision=bf16"])
    return root, reference, plain, codes, lines


def test_fp8_blocks_are_dequantized_on_import_and_export_plain(hub) -> None:
    root, _, plain, codes, lines = hub
    assert codes == [0, 1, 1, 0, 0], lines
    back = hf_tensors(root / "back")
    assert set(back) == set(plain)  # no scales: the export holds the dequantized weights
    assert all(torch.equal(back[k], plain[k]) for k in plain), [k for k in plain if not torch.equal(back[k], plain[k])]
    assert "quantization_config" not in json.loads((root / "back" / "config.json").read_text())


def test_a_bf16_import_rounds_the_dequantized_weights_to_bf16(hub) -> None:
    """Into ``precision=bf16`` the dequantized fp32 product is rounded once, as DeepSeek's ``fp8_cast_bf16.py``
    does, not refused as a cast that changes values."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    root, _, plain, _, _ = hub
    dcp_to_torch_save(root / "ck_bf16" / "step_0000000", root / "ck_bf16.pt")
    sd = torch.load(root / "ck_bf16.pt", weights_only=False)
    pairs = {"decoder.layers.1.self_attention.linear_kv_down_proj.weight": "self_attn.kv_a_proj_with_mqa.weight",
             "decoder.layers.1.self_attention.linear_q_up_proj.weight": "self_attn.q_b_proj.weight"}  # fmt: skip
    for mcore, hf in pairs.items():
        want = plain[f"model.layers.1.{hf}"]
        assert sd[mcore].dtype == torch.bfloat16 and torch.equal(sd[mcore], want.to(torch.bfloat16)), mcore
        assert not torch.equal(sd[mcore].float(), want), mcore  # rounding happened: fp32 would not fit exactly


def test_a_scale_of_the_wrong_shape_and_other_quantizations_are_refused_in_one_line(hub) -> None:
    root, _, _, _, lines = hub
    bad = [line for line in lines if "kv_a_proj_with_mqa.weight_scale_inv" in line]
    assert len(bad) == 1 and "shape [1, 3]" in bad[0] and "[2, 3]" in bad[0] and "16x24" in bad[0], lines
    other = [line for line in lines if "bitsandbytes" in line]
    assert len(other) == 1 and "quant_method 'bitsandbytes'" in other[0], lines
    assert not (root / "ck_bad").exists() and not (root / "ck_other").exists()


@pytest.mark.slow
def test_fp8_import_logits_match_the_dequantized_transformers_model(hub, tmp_path) -> None:
    root, reference, _, _, _ = hub
    plan = forward_plan(root, tmp_path, {"hub": reference}, [("hub", "ck_hf", 1, 1, 1), ("hub", "ck_hf", 1, 1, 2)])
    out = run_forward_plan(plan, tmp_path)
    assert_logits_match(plan, out, TOLERANCE)
    diffs = [json.loads(p.read_text())["max_abs_diff"] for p in out.glob("*.rank*.json")]
    print(f"fp8 hub import: max |logit difference| {max(diffs):.3g}")


def add_mtp_layer(folder, model, seed: int) -> dict[str, torch.Tensor]:
    """DeepSeek-V3's MTP layer as its checkpoints store it, written into ``folder`` (a shard of its own, in the
    index): ``model.layers.{L}.`` with random norms, ``eh_proj`` and a decoder layer shaped as the last one, and
    ``embed_tokens``/``shared_head.head`` copies of the main model's. Returns those tensors."""
    g = torch.Generator().manual_seed(seed)
    layers = model.config.num_hidden_layers
    tensors = hf_tensors(folder)
    last, p = f"model.layers.{layers - 1}.", f"model.layers.{layers}."
    mtp = {
        p + k.removeprefix(last): 0.1 * torch.randn(t.shape, generator=g)
        for k, t in tensors.items()
        if k.startswith(last)
    }
    h = model.config.hidden_size
    for name in ("enorm", "hnorm", "shared_head.norm"):
        mtp[f"{p}{name}.weight"] = 1 + 0.1 * torch.randn(h, generator=g)
    mtp[p + "eh_proj.weight"] = 0.1 * torch.randn(h, 2 * h, generator=g)
    mtp[p + "embed_tokens.weight"] = tensors["model.embed_tokens.weight"].clone()
    mtp[p + "shared_head.head.weight"] = tensors["lm_head.weight"].clone()
    save_file(mtp, str(folder / "model-mtp.safetensors"), metadata={"format": "pt"})
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    index["weight_map"].update(dict.fromkeys(mtp, "model-mtp.safetensors"))
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    return mtp


def mtp_expected(mtp: dict[str, torch.Tensor], p: str, inner: str) -> dict[str, torch.Tensor]:
    """The Megatron-Core tensors (single rank, experts stacked as torch_dist saves them) of MTP layer 0 whose Hugging
    Face tensors ``mtp`` start with ``p``, its decoder layer named ``inner``: written out by name, as
    Megatron-Bridge's DeepSeek mapping pairs them."""
    t, a, moe = f"mtp.layers.0.{inner}.", "self_attention.", "mlp."
    pairs = {"enorm": "mtp.layers.0.enorm", "hnorm": "mtp.layers.0.hnorm", "eh_proj": "mtp.layers.0.eh_proj",
             "shared_head.norm": "mtp.layers.0.final_layernorm", "input_layernorm": t + "input_layernorm",
             "post_attention_layernorm": t + "pre_mlp_layernorm", "self_attn.q_a_proj": t + a + "linear_q_down_proj",
             "self_attn.q_b_proj": t + a + "linear_q_up_proj", "self_attn.q_a_layernorm": t + a + "q_layernorm",
             "self_attn.kv_a_proj_with_mqa": t + a + "linear_kv_down_proj",
             "self_attn.kv_b_proj": t + a + "linear_kv_up_proj", "self_attn.kv_a_layernorm": t + a + "kv_layernorm",
             "self_attn.o_proj": t + a + "linear_proj", "mlp.gate": t + moe + "router",
             "mlp.shared_experts.down_proj": t + moe + "shared_experts.linear_fc2"}  # fmt: skip
    out = {mc + ".weight": mtp[f"{p}{hf}.weight"] for hf, mc in pairs.items()}
    out[t + moe + "router.expert_bias"] = mtp[p + "mlp.gate.e_score_correction_bias"]
    shared = p + "mlp.shared_experts."
    out[t + moe + "shared_experts.linear_fc1.weight"] = torch.cat(
        [mtp[shared + "gate_proj.weight"], mtp[shared + "up_proj.weight"]]
    )
    e = [f"{p}mlp.experts.{i}." for i in range(4)]
    out[t + moe + "experts.experts.linear_fc1.weight"] = torch.stack(
        [torch.cat([mtp[x + "gate_proj.weight"], mtp[x + "up_proj.weight"]]) for x in e]
    )
    out[t + moe + "experts.experts.linear_fc2.weight"] = torch.stack([mtp[x + "down_proj.weight"] for x in e])
    return out


@pytest.fixture(scope="module")
def mtp_hub(tmp_path_factory):
    """A tiny DeepSeek-V3 with its MTP layer added (``hf``), imported without a recipe (``ck``) and exported
    (``back``); imported into a model without MTP (``ck_none``); and with a ``shared_head.head`` that is not the
    main output layer (``dup``), refused."""
    root = tmp_path_factory.mktemp("deepseek_mtp")
    model = make("deepseek_v3", root / "hf", seed=6)
    mtp = add_mtp_layer(root / "hf", model, seed=7)
    shutil.copytree(root / "hf", root / "dup")
    add_mtp_layer(root / "dup", model, seed=7)
    other = {**mtp, "model.layers.3.shared_head.head.weight": mtp["model.layers.3.shared_head.head.weight"] + 1e-3}
    save_file(other, str(root / "dup" / "model-mtp.safetensors"), metadata={"format": "pt"})
    codes, lines = convert_output(
        ["hf-to-mcore", str(root / "hf"), str(root / "ck")],
        ["mcore-to-hf", str(root / "ck"), str(root / "back")],
        ["hf-to-mcore", str(root / "hf"), str(root / "ck_none"), "model.mtp_num_layers=null"],
        ["hf-to-mcore", str(root / "dup"), str(root / "ck_dup")],
    )
    return root, model, mtp, codes, lines


def test_mtp_layers_land_in_megatron_cores_mtp_block_and_export_bit_identically(mtp_hub) -> None:
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    root, model, mtp, codes, lines = mtp_hub
    assert codes[:3] == [0, 0, 0], lines
    saved = json.loads((root / "ck" / "step_0000000" / "trainer_state.json").read_text())["model"]
    assert saved["mtp_num_layers"] == 1
    dcp_to_torch_save(root / "ck" / "step_0000000", root / "ck.pt")
    sd = torch.load(root / "ck.pt", weights_only=False)
    inner = "mtp_model_layer" if "mtp.layers.0.mtp_model_layer.input_layernorm.weight" in sd else "transformer_layer"
    expected = mtp_expected(mtp, "model.layers.3.", inner)  # megatron-core 0.19 names it mtp_model_layer
    assert len(expected) == 19 and all(torch.equal(sd[k], v) for k, v in expected.items()), [
        k for k, v in expected.items() if not torch.equal(sd[k], v)
    ]
    original, back = hf_tensors(root / "hf"), hf_tensors(root / "back")
    assert set(back) == set(original) and set(mtp) < set(back)
    assert all(torch.equal(back[k], original[k]) for k in original), [
        k for k in original if not torch.equal(back[k], original[k])
    ]
    assert json.loads((root / "back" / "config.json").read_text())["num_nextn_predict_layers"] == 1
    said = [line for line in lines if "/back" in line]
    assert len(said) == 1 and "dropped" not in said[0], lines
    reloaded = model_class("deepseek_v3").from_pretrained(root / "back").eval()  # ignores model.layers.3.*
    tokens = torch.randint(0, 258, (1, 12), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert torch.equal(reloaded(tokens).logits, model(tokens).logits)


def test_a_model_without_mtp_drops_the_mtp_layer_in_one_line_and_a_differing_copy_is_refused(mtp_hub) -> None:
    root, _, _, codes, lines = mtp_hub
    assert codes[2:] == [0, 1], lines
    saved = json.loads((root / "ck_none" / "step_0000000" / "trainer_state.json").read_text())["model"]
    assert saved["mtp_num_layers"] is None
    said = [line for line in lines if "ck_none" in line]
    assert len(said) == 1 and "dropped the 1 multi-token-prediction layer(s) model.layers.3.* (32 tensors" in said[0]
    dup = [line for line in lines if "shared_head.head.weight" in line]
    assert len(dup) == 1 and "differs from lm_head.weight" in dup[0] and "output_layer.weight" in dup[0], lines
    assert not (root / "ck_dup").exists()
