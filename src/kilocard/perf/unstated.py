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
    "software.tp_comm_overlap": False,
}
"""Default per unstated field. ``batch.mbs``: 1, what the Megatron-Bridge and NeMo pre-training
recipes set (Megatron-Bridge ``src/megatron/bridge/recipes/llama/h100/llama3.py``:
``cfg.train.micro_batch_size = 1``). ``recompute``: none (Megatron-Core's
``recompute_granularity=None``). ``parallel.vp``:
not interleaved (``virtual_pipeline_model_parallel_size=None``), only where the source does not state an
interleaved schedule (module docstring). ``parallel.cp``/``ep``: 1.
``parallel.etp``: 1, what the Megatron-Bridge and NeMo MoE recipes set
(``expert_tensor_parallel_size=1``). ``fp8_recipe``: ``delayed``, Transformer Engine's default
scaling recipe (NeMo before 25.04); rows of later releases state ``tensorwise``/``mxfp8``.
``software.tp_comm_overlap``: off, for a row whose trainer's recipe is not published (the Llama 3 paper's
own trainer): the framework default both of Megatron-Core (``ModelParallelConfig.tp_comm_overlap = False``,
``megatron/core/model_parallel_config.py``) and of PyTorch-native tensor parallelism (torchtitan's
``Parallelism.enable_async_tensor_parallel = False``, ``torchtitan/config/job_config.py`` at 6404b93); the
software-generation rule's overlap (``kilocard.perf.baselines``) stands for the Megatron recipes that set it."""

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
    without ``filled_from`` saying where that value comes from."""
    unstated = raw.get("unstated") or []
    if not isinstance(unstated, list) or any(f not in KNOWN for f in unstated):
        raise ValueError(
            f"--file: {where}: unstated: {unstated!r} must be a list of field names from: {', '.join(sorted(KNOWN))}"
        )
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
