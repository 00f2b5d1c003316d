"""One mapping from the config to Megatron's names, used by the adapter and the FLOPs/memory formulas.

``megatron_fields`` is built from the schema's field list, so it covers every model, parallel,
precision and optim field except ``KILOCARD_OWN_FIELDS``; the adapter's real Megatron-Core
configs (built here, on CPU, without a process group) carry each of those values unchanged, and
Megatron-LM's ``args`` for the FLOPs and memory formulas start from the same mapping.
"""

from __future__ import annotations

import dataclasses
import warnings

import pytest

from kilocard.config.compose import compose, to_run_config
from kilocard.config.megatron import MEGATRON_GROUPS, megatron_fields, megatron_kwargs
from kilocard.config.schema import KILOCARD_OWN_FIELDS, RunConfig
from kilocard.perf.megatron_lm import megatron_lm_args

#: Fields the adapter sets from the backend or converts (a callable, an enum, CPU switches).
ADAPTED = {
    "gated_linear_unit",
    "attention_backend",
    "overlap_p2p_comm",
    "tp_comm_overlap",
    "moe_grouped_gemm",
    "main_params_dtype",  # dtype names -> torch dtypes (build_optimizer)
    "exp_avg_dtype",
    "exp_avg_sq_dtype",
}


def test_mapping_covers_every_schema_field_except_kilocards_own() -> None:
    cfg = RunConfig()
    expected = {
        f.name: getattr(getattr(cfg, group), f.name)
        for group in MEGATRON_GROUPS
        for f in dataclasses.fields(getattr(cfg, group))
        if f"{group}.{f.name}" not in KILOCARD_OWN_FIELDS
    }
    assert megatron_fields(cfg) == expected
    own_names = {path.partition(".")[2] for path in KILOCARD_OWN_FIELDS}
    assert not own_names & set(megatron_fields(cfg))


@pytest.fixture(scope="module")
def cpu():
    """The CPU backend (``kilocard.backends`` imports torch: only the tests that build Megatron-Core configs)."""
    from kilocard.backends import Backend

    return Backend(name="cpu", dist_backend="gloo", local_spec=True)


@pytest.mark.integration  # builds real Megatron-Core configs
@pytest.mark.parametrize("recipe", ["tiny_gpt", "tiny_moe"])
def test_adapter_configs_carry_every_mapped_value(recipe: str, cpu) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Transformer Engine and Apex are not installed" on CPU machines
        from megatron.core.distributed import DistributedDataParallelConfig
        from megatron.core.optimizer import OptimizerConfig

        from kilocard.train.megatron_adapter import transformer_config
    cfg = to_run_config(compose([f"recipe={recipe}"]))
    tc = transformer_config(cfg, cpu)
    mapped = megatron_fields(cfg)
    checked = 0
    for cls, built in (
        (type(tc), tc),
        (
            OptimizerConfig,
            OptimizerConfig(**{k: v for k, v in megatron_kwargs(cfg, OptimizerConfig).items() if k not in ADAPTED}),
        ),
        (
            DistributedDataParallelConfig,
            DistributedDataParallelConfig(**megatron_kwargs(cfg, DistributedDataParallelConfig)),
        ),
    ):
        for name in {f.name for f in dataclasses.fields(cls)} & set(mapped) - ADAPTED:
            if mapped[name] is not None:  # Megatron-Core fills a None (e.g. ffn_hidden_size) in __post_init__
                assert getattr(built, name) == mapped[name], (cls.__name__, name)
                checked += 1
    assert checked > 40


def test_megatron_lm_args_start_from_the_mapping() -> None:
    """The FLOPs and memory formulas read the mapped values; only Megatron-LM's derived names differ."""
    cfg = to_run_config(compose(["recipe=tiny_moe"]))
    args = vars(megatron_lm_args(cfg))
    derived = {"ffn_hidden_size", "kv_channels", "num_query_groups", "moe_layer_freq", "moe_ffn_hidden_size"}
    for name, value in megatron_fields(cfg).items():
        if name not in derived:
            assert args[name] == value, name


@pytest.mark.integration  # builds a real Megatron-Core config
def test_attention_backend_reaches_megatron_core_and_a_bad_name_is_one_line(cpu) -> None:
    """``model.attention_backend`` used to be charged by the step-time model but never passed to Megatron-Core."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.transformer.enums import AttnBackend

        from kilocard.train.megatron_adapter import UnsupportedConfig, transformer_config
    cfg = to_run_config(compose(["recipe=tiny_gpt", "model.attention_backend=local"]))
    assert transformer_config(cfg, cpu).attention_backend == AttnBackend.local
    bad = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, attention_backend="sdpa"))
    with pytest.raises(UnsupportedConfig, match=r"^model.attention_backend: 'sdpa' is not one of .*auto"):
        transformer_config(bad, cpu)


@pytest.mark.integration  # builds Megatron-Core configs (imports torch)
def test_what_the_cpu_trainer_cannot_build_is_refused_in_one_line(cpu) -> None:
    """Megatron-FSDP, activation offloading and the precision-aware optimizer reach the estimates (the published
    runs used them) but the trainer builds none of them on CPU ranks: each is refused naming field and fix."""
    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from kilocard.train.megatron_adapter import UnsupportedConfig, optimizer_config, transformer_config, wrap_ddp
    cfg = to_run_config(compose(["recipe=tiny_gpt"]))

    def with_(group: str, **kw):
        return dataclasses.replace(cfg, **{group: dataclasses.replace(getattr(cfg, group), **kw)})

    with pytest.raises(UnsupportedConfig, match=r"^parallel.use_megatron_fsdp: .*set parallel.use_megatron_fsdp=false"):
        wrap_ddp(with_("parallel", use_megatron_fsdp=True), None, [])
    with pytest.raises(UnsupportedConfig, match=r"^parallel.cpu_offloading: .*set parallel.cpu_offloading=false"):
        transformer_config(with_("parallel", cpu_offloading=True, cpu_offloading_num_layers=1), cpu)
    if not torch.cuda.is_available():  # with GPUs Megatron-Core builds it (Transformer Engine's FusedAdam)
        with pytest.raises(UnsupportedConfig, match=r"^optim.use_precision_aware_optimizer: .*=false"):
            optimizer_config(with_("optim", use_precision_aware_optimizer=True))
    built = optimizer_config(cfg)  # the dtype names reach Megatron-Core as torch dtypes
    assert (built.main_params_dtype, built.exp_avg_dtype, built.exp_avg_sq_dtype) == (torch.float32,) * 3
