"""Block-scaled FP8 weights on import: DeepSeek-V3's and Kimi-K2's published checkpoints.

Their ``config.json`` says ``quantization_config: {quant_method: fp8, weight_block_size: [R, C], ...}`` and each
quantized linear weight ``X.weight`` is stored as ``float8_e4m3fn`` beside ``X.weight_scale_inv``: one float per
``R x C`` block (the last row and column blocks cut short where the weight's dimensions are not multiples of the
block), the weight being ``fp8 value x scale_inv`` of its block, as DeepSeek's own ``inference/fp8_cast_bf16.py``
(``weight_dequant``) and Megatron-Bridge's AutoBridge dequantize it. The import dequantizes tensor by tensor into
the recipe's parameter dtype (rounded to it, as ``fp8_cast_bf16.py`` rounds to bfloat16); every other quantization
method is refused by name.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import torch

from kilocard.convert.spec import ConvertError

SCALE = "_scale_inv"
"""Suffix of a block scale's name, after its weight's (``X.weight`` -> ``X.weight_scale_inv``)."""
FP8 = "F8_E4M3"
"""safetensors' code of ``float8_e4m3fn``, the one FP8 format the published checkpoints use."""
SCALE_DTYPES = ("F32", "BF16", "F16")


def block_size(hf_config: dict[str, Any]) -> tuple[int, int] | None:
    """The ``(rows, columns)`` of a weight block of ``config.json``'s FP8 quantization (``None``: unquantized);
    any other method, or a block size that is not two positive whole numbers, is refused by name."""
    quant = hf_config.get("quantization_config")
    if quant is None:
        return None
    method = quant.get("quant_method") if isinstance(quant, dict) else quant
    if method != "fp8":
        raise ConvertError(
            f"config.json: quantization_config has quant_method {method!r}; kilocard imports unquantized weights "
            f"or block-scaled fp8 ones (DeepSeek-V3's): dequantize the model first"
        )
    block = quant.get("weight_block_size")
    whole = isinstance(block, list) and len(block) == 2
    if not whole or not all(isinstance(b, int) and not isinstance(b, bool) and b > 0 for b in block):
        raise ConvertError(
            f"config.json: quantization_config.weight_block_size is {block!r}, expected two positive whole numbers "
            f"(DeepSeek-V3's [128, 128]); kilocard dequantizes block-scaled fp8 weights only"
        )
    return block[0], block[1]


def scale_shape(shape: tuple[int, ...], block: tuple[int, int]) -> tuple[int, int]:
    """The block scale's shape of a weight of ``shape``: one per block, edge blocks included."""
    return math.ceil(shape[0] / block[0]), math.ceil(shape[1] / block[1])


def dequantized_headers(found: dict[str, Any], block: tuple[int, int] | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """``found`` (``st_io.Header`` by name) without the block scales, each FP8 weight shown as the float32 it
    dequantizes to; and the scale header of each FP8 weight by the weight's name. Refuses an FP8 weight without
    its scale, a scale without an FP8 weight, or a scale of the wrong shape or dtype, naming the tensor."""
    if block is None:
        return found, {}
    scales = {n.removesuffix(SCALE): h for n, h in found.items() if n.endswith(SCALE)}
    out = {n: h for n, h in found.items() if not n.endswith(SCALE)}
    for name, h in out.items():
        if h.dtype == FP8 and name not in scales:
            raise ConvertError(f"{h.file.name}: fp8 tensor {name} has no {name}{SCALE}; the checkpoint is incomplete")
    for name, s in scales.items():
        w = out.get(name)
        if w is None or w.dtype != FP8 or len(w.shape) != 2:
            what = "no such tensor" if w is None else f"{w.dtype} of shape {list(w.shape)}"
            raise ConvertError(
                f"{s.file.name}: tensor {name}{SCALE} scales {name}, which is {what}, not a 2-d fp8 weight"
            )
        want = scale_shape(w.shape, block)
        if s.shape != want or s.dtype not in SCALE_DTYPES:
            raise ConvertError(
                f"{s.file.name}: tensor {name}{SCALE} is {s.dtype} of shape {list(s.shape)}; {name} of shape "
                f"{list(w.shape)} in {block[0]}x{block[1]} blocks (quantization_config.weight_block_size) needs a "
                f"float scale of shape {list(want)}"
            )
        out[name] = replace(w, dtype="F32")
    return out, scales


def dequantize(weight: torch.Tensor, scale_inv: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    """``weight`` (fp8) times its block's ``scale_inv``, in float32 (``weight_dequant``'s arithmetic)."""
    rows, cols = weight.shape
    per = scale_inv.float().repeat_interleave(block[0], 0)[:rows].repeat_interleave(block[1], 1)[:, :cols]
    return weight.float() * per
