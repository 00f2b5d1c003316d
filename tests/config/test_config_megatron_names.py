"""Schema field names are Megatron-Core 0.16.1's own, and every recipe is a valid Megatron-Core config.

Checked against the installed, pinned megatron-core wheel (``dataclasses.fields`` of its config
classes): a model/parallel/precision/optim field either exists there under the same name or is
listed in ``KILOCARD_OWN_FIELDS`` with its reason. Each recipe's fields are then passed to the real
``TransformerConfig`` / ``MLATransformerConfig`` constructor, whose ``__post_init__`` enforces
Megatron-Core's own rules (pipeline split, MoE and MLA settings).
"""

from __future__ import annotations

import dataclasses
import warnings

import pytest

from kilocard.config.schema import (
    KILOCARD_OWN_FIELDS,
    ModelConfig,
    OptimConfig,
    ParallelConfig,
    PrecisionConfig,
    RunConfig,
)

CHECKED_GROUPS = {"model": ModelConfig, "parallel": ParallelConfig, "precision": PrecisionConfig, "optim": OptimConfig}


@pytest.fixture(scope="module")
def mcore():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Transformer Engine and Apex are not installed" on CPU machines
        import megatron.core
        from megatron.core.distributed import DistributedDataParallelConfig
        from megatron.core.model_parallel_config import ModelParallelConfig
        from megatron.core.optimizer import OptimizerConfig
        from megatron.core.transformer.transformer_config import MLATransformerConfig, TransformerConfig
    assert megatron.core.__version__ == "0.16.1"
    classes = (
        TransformerConfig,
        MLATransformerConfig,
        ModelParallelConfig,
        OptimizerConfig,
        DistributedDataParallelConfig,
    )
    return {
        "names": {f.name for c in classes for f in dataclasses.fields(c)},
        "tc": TransformerConfig,
        "mla": MLATransformerConfig,
    }


@pytest.mark.integration  # builds real Megatron-Core configs
def test_every_field_is_megatron_cores_or_listed_as_kilocards_own(mcore) -> None:
    names: set[str] = mcore["names"]
    unmapped = [
        f"{group}.{f.name}"
        for group, cls in CHECKED_GROUPS.items()
        for f in dataclasses.fields(cls)
        if f.name not in names and f"{group}.{f.name}" not in KILOCARD_OWN_FIELDS
    ]
    assert unmapped == [], "rename to Megatron-Core's name or add to KILOCARD_OWN_FIELDS with a reason"


def test_own_fields_are_real_fields_with_reasons() -> None:
    groups = {f.name: f.default_factory() for f in dataclasses.fields(RunConfig)}  # launcher.* too
    for path, reason in KILOCARD_OWN_FIELDS.items():
        group, _, name = path.partition(".")
        assert name in {f.name for f in dataclasses.fields(groups[group])}, path
        assert len(reason) > 10, path


def megatron_kwargs(rc: RunConfig, known: set[str]) -> dict[str, object]:
    """The recipe's model/parallel/precision fields that the Megatron-Core config class takes."""
    import torch

    kw = {
        f.name: getattr(grp, f.name)
        for grp in (rc.model, rc.parallel, rc.precision)
        for f in dataclasses.fields(grp)
        if f.name in known
    }
    kw["params_dtype"] = getattr(torch, rc.precision.params_dtype)
    kw["pipeline_dtype"] = kw["params_dtype"]
    for te_only in ("fp8", "fp8_recipe", "fp8_param", "fp4"):  # need Transformer Engine at construction
        kw.pop(te_only, None)
    return kw


@pytest.mark.integration  # builds real Megatron-Core configs
def test_every_recipe_builds_a_real_transformer_config(mcore, all_recipes: dict[str, RunConfig]) -> None:
    for name, rc in all_recipes.items():
        cls = mcore["mla"] if rc.model.multi_latent_attention else mcore["tc"]
        known = {f.name for f in dataclasses.fields(cls)}
        try:
            cfg = cls(**megatron_kwargs(rc, known))
        except (ValueError, AssertionError) as e:
            pytest.fail(f"{name}: Megatron-Core rejects the recipe: {e}")
        assert cfg.num_layers == rc.model.num_layers


@pytest.mark.integration  # builds real Megatron-Core configs
def test_megatron_core_rejects_a_bad_split(mcore, all_recipes: dict[str, RunConfig]) -> None:
    """The construction above is a real check: an uneven pipeline split is refused."""
    rc = all_recipes["deepseek_v3"]
    bad = dataclasses.replace(rc, parallel=dataclasses.replace(rc.parallel, num_layers_in_last_pipeline_stage=2))
    with pytest.raises(ValueError):
        mcore["mla"](**megatron_kwargs(bad, {f.name for f in dataclasses.fields(mcore["mla"])}))
