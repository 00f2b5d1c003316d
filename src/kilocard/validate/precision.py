"""Rules on numeric formats: fp16/bf16, FP8/FP4 support on the GPU, fp8_param, params dtype.

Which formats, recipes and dtypes exist is the domain table's (``config.domains``: ``FP8_FORMAT``,
``FP8_RECIPE``, ``FP4_FORMAT``, ``PARAMS_DTYPE``); these rules check what a value means beside the others.
"""

from __future__ import annotations

from collections.abc import Iterable

from kilocard.config.domains import choices
from kilocard.config.schema import RunConfig
from kilocard.layout import Layout
from kilocard.topology import gpu_spec
from kilocard.validate.issues import Issue, error

R = "precision."
PARAM_DTYPES = choices("precision.params_dtype")


def rule_half_precision(cfg: RunConfig, lay: Layout) -> Iterable[Issue]:
    """Not both fp16 and bf16; params dtype agrees with the mixed-precision flag."""
    pr = cfg.precision
    if pr.fp16 and pr.bf16:
        yield error(
            "FP16_AND_BF16", R + "fp16", True, "fp16 and bf16 are both true", f"set {R}fp16=false or {R}bf16=false"
        )
        return
    if pr.params_dtype not in PARAM_DTYPES:
        return  # a dtype kilocard does not know: the domain table's PARAMS_DTYPE
    want = "bfloat16" if pr.bf16 else "float16" if pr.fp16 else "float32"
    if pr.params_dtype not in ("float32", want):
        yield error(
            "PARAMS_DTYPE",
            R + "params_dtype",
            pr.params_dtype,
            f"params_dtype({pr.params_dtype}) does not match bf16({pr.bf16}) / fp16({pr.fp16})",
            f"set {R}params_dtype={want}",
        )


def rule_fp8(cfg: RunConfig, lay: Layout) -> Iterable[Issue]:
    """FP8 needs a GPU with FP8 tensor cores; not with FP4."""
    pr, gpu = cfg.precision, gpu_spec(cfg.cluster.gpu)
    if pr.fp8 is not None and pr.fp4 is not None:
        yield error(
            "FP8_AND_FP4", R + "fp4", pr.fp4, "fp8 and fp4 cannot be used together", f"set {R}fp4=null or {R}fp8=null"
        )
    if pr.fp8 is None:
        return
    if gpu is not None and gpu.vendor != "cpu" and not gpu.has_fp8:
        yield error(
            "FP8_UNSUPPORTED_GPU",
            R + "fp8",
            pr.fp8,
            f"{gpu.name} has no FP8 tensor cores",
            f"set {R}fp8=null (bf16), or use an H100/H200/B200 cluster",
        )
    if gpu is not None and pr.fp8_recipe == "mxfp8" and gpu.vendor == "nvidia" and gpu.compute_capability < (10, 0):
        yield error(
            "FP8_RECIPE_GPU",
            R + "fp8_recipe",
            "mxfp8",
            f"the mxfp8 recipe needs Blackwell; {gpu.name} is sm_"
            f"{gpu.compute_capability[0]}{gpu.compute_capability[1]}",
            f"set {R}fp8_recipe=tensorwise",
        )


def rule_fp4(cfg: RunConfig, lay: Layout) -> Iterable[Issue]:
    """FP4 needs a GPU with FP4 tensor cores (Blackwell)."""
    pr, gpu = cfg.precision, gpu_spec(cfg.cluster.gpu)
    if pr.fp4 is None:
        return
    if gpu is not None and gpu.vendor != "cpu" and not gpu.has_fp4:
        yield error(
            "FP4_UNSUPPORTED_GPU",
            R + "fp4",
            pr.fp4,
            f"{gpu.name} has no FP4 tensor cores",
            f"set {R}fp4=null, or use a B200/GB200 cluster",
        )


def rule_fp8_param(cfg: RunConfig, lay: Layout) -> Iterable[Issue]:
    """fp8_param needs fp8 (Megatron-Core) and the distributed optimizer (Megatron-LM)."""
    pr = cfg.precision
    if not pr.fp8_param:
        return
    if pr.fp8 is None:
        yield error(
            "FP8_PARAM_WITHOUT_FP8",
            R + "fp8_param",
            True,
            "fp8_param needs fp8 mode, but fp8 is null",
            f"set {R}fp8=hybrid or {R}fp8_param=false",
        )
    if not cfg.parallel.use_distributed_optimizer:
        yield error(
            "FP8_PARAM_NEEDS_DISTOPT",
            "parallel.use_distributed_optimizer",
            False,
            "fp8_param keeps FP8 parameters that only the distributed optimizer can gather",
            "set parallel.use_distributed_optimizer=true",
        )


RULES = (rule_half_precision, rule_fp8, rule_fp4, rule_fp8_param)
