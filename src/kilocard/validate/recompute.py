"""Rules on activation recompute fields (Megatron-Core ``TransformerConfig`` + Megatron-LM)."""

from __future__ import annotations

from collections.abc import Iterable

from kilocard.config.domains import choices
from kilocard.config.schema import RunConfig
from kilocard.layout import Layout
from kilocard.validate.issues import Issue, error, warning

P = "parallel."


def rule_recompute(cfg: RunConfig, lay: Layout) -> Iterable[Issue]:
    """Granularity full/selective; full needs method uniform/block and recompute_num_layers."""
    p = cfg.parallel
    g, meth, k = p.recompute_granularity, p.recompute_method, p.recompute_num_layers
    if g is None:
        if meth is not None or k is not None:
            yield warning(
                "RECOMPUTE_IGNORED",
                P + "recompute_method",
                meth,
                "recompute_method/recompute_num_layers are set but recompute_granularity is null",
                f"set {P}recompute_granularity=full, or clear the other two",
            )
        return
    if g not in choices("parallel.recompute_granularity"):
        yield error(
            "RECOMPUTE_GRANULARITY",
            P + "recompute_granularity",
            g,
            f"recompute_granularity {g!r} must be full or selective",
            f"set {P}recompute_granularity=selective",
        )
        return
    if meth is not None and meth not in choices("parallel.recompute_method"):
        yield error(
            "RECOMPUTE_METHOD",
            P + "recompute_method",
            meth,
            f"recompute_method {meth!r} must be uniform or block",
            f"set {P}recompute_method=uniform",
        )
    elif g == "full" and meth is None:
        yield error(
            "RECOMPUTE_METHOD",
            P + "recompute_method",
            None,
            "full recompute needs recompute_method uniform or block",
            f"set {P}recompute_method=uniform",
        )
    elif g == "selective" and meth is not None:
        yield error(
            "RECOMPUTE_SELECTIVE_METHOD",
            P + "recompute_method",
            meth,
            "recompute_method is not supported with selective recompute (Megatron-LM)",
            f"set {P}recompute_method=null",
        )
    if g == "full":
        per_stage = lay.stage_layers[0] if lay.stage_layers else cfg.model.num_layers // lay.pp
        if k is None:
            yield error(
                "RECOMPUTE_NUM_LAYERS",
                P + "recompute_num_layers",
                None,
                f"full recompute needs recompute_num_layers between 1 and the layers per stage ({per_stage})",
                f"set {P}recompute_num_layers=1",
            )
        elif k < 1 or (per_stage > 0 and k > per_stage):
            yield error(
                "RECOMPUTE_NUM_LAYERS_RANGE",
                P + "recompute_num_layers",
                k,
                f"recompute_num_layers({k}) must be between 1 and the layers per stage ({per_stage})",
                f"set {P}recompute_num_layers=1",
            )
    elif k is not None:
        yield error(
            "RECOMPUTE_NUM_LAYERS",
            P + "recompute_num_layers",
            k,
            "recompute_num_layers must be null with selective recompute",
            f"set {P}recompute_num_layers=null",
        )


RULES = (rule_recompute,)
