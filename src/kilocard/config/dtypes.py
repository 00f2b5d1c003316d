"""The one reading of ``precision``: which dtype parameters and gradients are in, bytes per element.

Megatron-Core builds the model in bf16/fp16 under mixed precision (whatever ``params_dtype`` says)
with an fp32 master copy in the optimizer, and in ``params_dtype`` otherwise; main gradients are
fp32 with ``grad_reduce_in_fp32`` and always without mixed precision. The adapter builds exactly
this, and the memory, checkpoint and step-time models count it.
"""

from __future__ import annotations

from kilocard.config.schema import PrecisionConfig


def mixed_precision(pr: PrecisionConfig) -> bool:
    """bf16 or fp16 mixed precision (an fp32 master copy of the parameters in the optimizer)."""
    return bool(pr.bf16 or pr.fp16)


def param_dtype(pr: PrecisionConfig) -> str:
    """The dtype the model's parameters are created in: ``bfloat16``, ``float16`` or ``params_dtype``."""
    if pr.bf16:
        return "bfloat16"
    if pr.fp16:
        return "float16"
    return pr.params_dtype


def main_grads_fp32(pr: PrecisionConfig) -> bool:
    """Main gradients (and their data-parallel reduce) in fp32: ``grad_reduce_in_fp32`` or no mixed precision."""
    return bool(pr.grad_reduce_in_fp32) or not mixed_precision(pr)


def param_bytes(pr: PrecisionConfig) -> int:
    """Bytes per parameter element: 4 in float32, else 2 (an unknown dtype name, which the validator
    reports, counts as 2 so that estimates stay total)."""
    return 4 if param_dtype(pr) == "float32" else 2
