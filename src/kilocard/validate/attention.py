"""Rules on sliding-window attention and the gated MLP's GPT-OSS settings: what Megatron-Core would build
differently from what the config says (a window that looks ahead, a window pattern with no window, a
document mask the windowed local attention drops, MLP settings read only by a gated MLP). Each field's own
range is in ``kilocard.config.domains``."""

from __future__ import annotations

from collections.abc import Iterable

from kilocard.config.schema import RunConfig
from kilocard.layout import Layout
from kilocard.validate.issues import Issue, error


def rule_window(cfg: RunConfig, lay: Layout) -> Iterable[Issue]:
    """``WINDOW``: ``window_size`` is ``[left >= 1, 0]`` (a right side lets a token see the ones after it, which a
    language model must not); ``window_attn_skip_freq`` needs a window and, as a list, one 0/1 per layer; no
    document mask (``data.reset_attention_mask``) with a window: Megatron-Core's local attention replaces the
    mask by the window's."""
    m = cfg.model
    w, skip = m.window_size, m.window_attn_skip_freq
    if w is not None and (not isinstance(w, list | tuple) or len(w) != 2 or w[0] < 1 or w[1] != 0):
        yield error(
            "WINDOW", "model.window_size", w,
            "window_size must be [left, 0] with left >= 1: causal attention over the left tokens only",
            "set model.window_size=[127,0] (GPT-OSS), or null for full attention",
        )  # fmt: skip
    if skip is not None and w is None:
        yield error(
            "WINDOW", "model.window_attn_skip_freq", skip,
            "window_attn_skip_freq picks the windowed layers, but model.window_size is null: Megatron-Core ignores it",
            "set model.window_size, or model.window_attn_skip_freq=null",
        )  # fmt: skip
    elif isinstance(skip, list | tuple) and (len(skip) != m.num_layers or any(v not in (0, 1) for v in skip)):
        yield error(
            "WINDOW", "model.window_attn_skip_freq", list(skip),
            f"window_attn_skip_freq lists {len(skip)} values; it needs one 0/1 per layer ({m.num_layers})",
            "give one 0 (full) or 1 (windowed) per layer, or an int k (every k-th layer full)",
        )  # fmt: skip
    if w is not None and cfg.data.reset_attention_mask:
        yield error(
            "WINDOW", "data.reset_attention_mask", True,
            "sliding-window attention replaces the per-document mask in Megatron-Core's local attention: the "
            "documents of a packed sequence would see each other",
            "set data.reset_attention_mask=false, or model.window_size=null",
        )  # fmt: skip


def rule_glu_settings(cfg: RunConfig, lay: Layout) -> Iterable[Issue]:
    """``GLU``: ``glu_linear_offset`` and ``activation_func_clamp_value`` act only in a gated MLP."""
    m = cfg.model
    gated = m.gated_linear_unit or m.activation == "swiglu"
    offset, clamp = m.glu_linear_offset != 0.0, m.activation_func_clamp_value is not None
    set_ = [n for n, v in (("glu_linear_offset", offset), ("activation_func_clamp_value", clamp)) if v]
    for name in set_ if not gated else ():
        yield error(
            "GLU", f"model.{name}", getattr(m, name),
            f"model.{name} acts only in a gated MLP; model.gated_linear_unit is false: Megatron-Core ignores it",
            f"set model.gated_linear_unit=true, or reset model.{name}",
        )  # fmt: skip


RULES = (rule_window, rule_glu_settings)
