"""The policy for facts a published throughput row does not state (``unstated:`` in a baselines file).

A source rarely states everything the step-time model needs: a table gives the layout and the batch
but not the micro-batch size, the recompute setting or the expert-TP size. A row names such facts in
``unstated: [batch.mbs, recompute, ...]`` (dotted field names) and each is then filled one of two ways:

* the row gives the value **and** ``filled_from:`` citing where it comes from: the framework's own
  recipe for that model and release (Megatron-Bridge ``scripts/performance/configs/...``, a NeMo
  recipe, the framework's launch script), the value a user of that framework gets for that run;
* the row gives no value and the value is the framework-independent default in ``DEFAULTS``: the
  value a Megatron-Core / NeMo / Megatron-Bridge user gets when the recipe does not set it.

A fact that is unstated, has no value in the row and no default here (a model dimension, the GPU,
the FLOPs convention) stays missing: the row is listed but not scored, with the fact named.

The interleaving depth: ``DEFAULTS``' ``parallel.vp: None`` (not interleaved) is for sources that do not
say which schedule ran. A source that states an interleaved schedule but not its depth contradicts that
default, and its depth is filled, in this order, by

1. the depth the source's own description of its model chunks fixes (the Llama 3 paper, Section 3.3.2:
   removing one layer from the first and last stage leaves the first chunk with only the embedding, so a
   chunk holds one layer: (126 + 2) / 16 = 8 chunks per pipeline rank), cited in ``filled_from``;
2. else the layers per virtual stage of that framework's recipe for the model, cited by file and commit;
3. else nothing: the row writes ``vp: interleaved`` (``INTERLEAVED``) and is listed but not scored, with
   ``parallel.vp`` named.

A recipe's module-level recompute (``recompute_modules``, kept in the row) fixes the row's ``recompute``:
``recompute_of_modules`` maps it to the step-time model's setting, and a row that says otherwise is refused.
"""

from __future__ import annotations

import copy
from typing import Any

DEFAULTS: dict[str, Any] = {
    "batch.mbs": 1,
    "recompute": "none",
    "parallel.vp": None,
    "parallel.cp": 1,
    "parallel.ep": 1,
    "parallel.etp": 1,
    "fp8_recipe": "delayed",
}
"""Default per unstated field. ``batch.mbs``: 1, what the Megatron-Bridge and NeMo pre-training
recipes set (Megatron-Bridge ``src/megatron/bridge/recipes/llama/h100/llama3.py``:
``cfg.train.micro_batch_size = 1``). ``recompute``: none (Megatron-Core's
``recompute_granularity=None``). ``parallel.vp``:
not interleaved (``virtual_pipeline_model_parallel_size=None``), only where the source does not state an
interleaved schedule (module docstring). ``parallel.cp``/``ep``: 1.
``parallel.etp``: 1, what the Megatron-Bridge and NeMo MoE recipes set
(``expert_tensor_parallel_size=1``). ``fp8_recipe``: ``delayed``, Transformer Engine's default
scaling recipe (NeMo before 25.04); rows of later releases state ``tensorwise``/``mxfp8``."""

INTERLEAVED = "interleaved"
"""``parallel.vp`` of a row whose source states an interleaved schedule without its depth: a stated fact
(no ``filled_from`` needed), which keeps the not-interleaved default out and leaves the depth missing."""

KNOWN = frozenset(DEFAULTS) | frozenset(
    {
        "gpus",
        "precision",
        "flops_convention",
        "parallel.tp",
        "parallel.pp",
        "parallel.dp",
        "batch.gbs",
        "model.vocab",
        "model.seq",
    }
)
"""Field names an ``unstated:`` list may use."""


SELECTIVE_MODULES = frozenset({"core_attn", "moe", "shared_experts"})
"""Megatron-Core ``recompute_modules`` entries that rerun a GEMM-bearing part of every layer they apply to
(``TransformerConfig.recompute_modules``, megatron-core 0.16.1: ``core_attn``, ``moe``, ``shared_experts``
use normal checkpointing): the step-time model's ``selective``."""

CHEAP_MODULES = frozenset({"moe_act", "layernorm", "mla_up_proj"})
"""Entries Megatron-Core reruns with output-discarding checkpointing (activation, norms, MLA up-projection
and RoPE): cheap elementwise work the step-time model does not charge, so ``none``."""


def recompute_of_modules(modules: list[str], moe: bool) -> str:
    """The step-time model's recompute setting (``selective`` or ``none``) for a recipe's
    ``recompute_modules`` on a model with (``moe``) or without routed experts.

    ``mlp`` is Megatron-Core's dense MLP submodule: ``TransformerLayer`` sets ``recompute_mlp`` only when
    ``not self.is_moe_layer`` (``megatron/core/transformer/transformer_layer.py``, megatron-core 0.16.1), so
    on a dense model it reruns part of every layer (``selective``, a partial recompute), while on an MoE
    model it reaches only the leading dense layers (DeepSeek-V3: 3 of 61), which are not charged apart.
    Raises ValueError for an entry Megatron-Core does not know."""
    unknown = sorted(set(modules) - SELECTIVE_MODULES - CHEAP_MODULES - {"mlp"})
    if unknown:
        known = ", ".join(sorted(SELECTIVE_MODULES | CHEAP_MODULES | {"mlp"}))
        raise ValueError(f"recompute_modules: {unknown} are not Megatron-Core module names ({known})")
    every_layer = SELECTIVE_MODULES | (set() if moe else {"mlp"})
    return "selective" if set(modules) & every_layer else "none"


def check_recompute_modules(raw: dict[str, Any], where: str) -> None:
    """Raises ValueError (one line) when a row's ``recompute`` is not what its ``recompute_modules`` run."""
    modules = raw.get("recompute_modules")
    if modules is None:
        return
    if not isinstance(modules, list):
        raise ValueError(f"--file: {where}: recompute_modules: {modules!r} must be a list, e.g. [mla_up_proj, mlp]")
    model = raw.get("model")
    moe = isinstance(model, dict) and bool(model.get("experts"))
    try:
        want = recompute_of_modules([str(m) for m in modules], moe)
    except ValueError as e:
        raise ValueError(f"--file: {where}: {e}") from None
    if raw.get("recompute") != want:
        raise ValueError(
            f"--file: {where}: recompute: {raw.get('recompute')!r} is not what recompute_modules {list(modules)} "
            f"run in Megatron-Core: write recompute: {want}"
        )


def _get(raw: dict[str, Any], field: str) -> Any:
    node: Any = raw
    for part in field.split("."):
        if not isinstance(node, dict):
            return None
        node = node.get(part)
    return node


def _set(raw: dict[str, Any], field: str, value: Any) -> None:
    *parents, leaf = field.split(".")
    node = raw
    for part in parents:
        node = node.setdefault(part, {})
    node[leaf] = value


def apply_policy(raw: dict[str, Any], where: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The row with its unstated facts filled, and ``{field: value}`` of those filled by ``DEFAULTS``.

    ``where`` names the row in errors (``row llama3-8b of published.yaml``). Raises ValueError when
    ``unstated`` is not a list of known field names, or names a field the row gives a value for
    without ``filled_from`` saying where that value comes from, or a ``recompute`` its
    ``recompute_modules`` contradict (``check_recompute_modules``)."""
    unstated = raw.get("unstated") or []
    if not isinstance(unstated, list) or any(f not in KNOWN for f in unstated):
        raise ValueError(
            f"--file: {where}: unstated: {unstated!r} must be a list of field names from: {', '.join(sorted(KNOWN))}"
        )
    check_recompute_modules(raw, where)
    out = copy.deepcopy(raw)
    filled: dict[str, Any] = {}
    for field in unstated:
        value = _get(raw, field)
        if value is not None and value != INTERLEAVED and not raw.get("filled_from"):
            raise ValueError(
                f"--file: {where}: unstated field {field} has the value {value!r} but no filled_from: "
                f"cite the recipe it comes from, or drop the value to take the policy default"
            )
        if value is None and field in DEFAULTS:
            _set(out, field, DEFAULTS[field])
            filled[field] = DEFAULTS[field]
    return out, filled
