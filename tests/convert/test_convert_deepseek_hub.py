"""DeepSeek-V3 as its hub checkpoint stores it: linear weights in block-scaled FP8 (``float8_e4m3fn`` beside a
``weight_scale_inv`` per block, ``quantization_config`` saying the block size). A tiny random
``DeepseekV3ForCausalLM`` is rewritten that way by the test; ``convert hf-to-mcore`` without a recipe dequantizes it,
and the Megatron-Core logits equal transformers' of the model the test dequantizes on its own."""

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
        if not quantized(name, t):
            stored[name] = plain[name] = t
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
    codes, lines = convert_output(*args, ["mcore-to-hf", str(root / "ck_hf"), str(root / "back")])
    return root, reference, plain, codes, lines


def test_fp8_blocks_are_dequantized_on_import_and_export_plain(hub) -> None:
    root, _, plain, codes, lines = hub
    assert codes == [0, 1, 1, 0], lines
    back = hf_tensors(root / "back")
    assert set(back) == set(plain)  # no scales: the export holds the dequantized weights
    assert all(torch.equal(back[k], plain[k]) for k in plain), [k for k in plain if not torch.equal(back[k], plain[k])]
    assert "quantization_config" not in json.loads((root / "back" / "config.json").read_text())


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
