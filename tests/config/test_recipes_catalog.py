"""Every shipped recipe composes, has a layout that divides, and the published rows are reproduced.

Composition is real Hydra (the session fixture ``all_recipes`` composes each recipe once). The layout
rules here are Megatron-Core's own arithmetic (world size, micro-batches, pipeline split, TP/CP/EP
divisibility); ``test_config_megatron_names.py`` additionally builds each recipe's real
``TransformerConfig``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from kilocard.calibration.unstated import DEFAULTS
from kilocard.config.compose import recipe_catalog
from kilocard.config.schema import RunConfig
from kilocard.paths import data_dir
from kilocard.perf.params import count_parameters
from kilocard.recipes import catalog_rows, recipe_row

GPU_KEYS = {
    "a100-sxm4-40gb", "a100-sxm4-80gb", "h100-sxm5-80gb", "h100-pcie-80gb", "h200-sxm-141gb",
    "b200-sxm-180gb", "gb200-nvl72", "mi300x", "cpu",
}  # fmt: skip


def published_rows() -> list[dict]:
    return yaml.safe_load((data_dir("baselines") / "published.yaml").read_text())["rows"]


def world(rc: RunConfig) -> int:
    return rc.cluster.nodes * rc.cluster.gpus_per_node


def layout_problems(rc: RunConfig) -> list[str]:
    """Megatron-Core's divisibility rules for the recipe's layout; an empty list when it is sound."""
    m, p, t = rc.model, rc.parallel, rc.trainer
    tp, pp, cp, ep = (
        p.tensor_model_parallel_size,
        p.pipeline_model_parallel_size,
        p.context_parallel_size,
        p.expert_model_parallel_size,
    )
    etp = p.expert_tensor_parallel_size or tp
    vp = p.virtual_pipeline_model_parallel_size
    out = []
    if world(rc) % (tp * pp * cp):
        out.append(f"world {world(rc)} not divisible by tp*pp*cp = {tp * pp * cp}")
        return out
    dp = world(rc) // (tp * pp * cp)
    if t.global_batch_size % (t.micro_batch_size * dp):
        out.append(f"gbs {t.global_batch_size} not divisible by mbs*dp = {t.micro_batch_size * dp}")
    elif vp and (t.global_batch_size // (t.micro_batch_size * dp)) % pp:
        out.append(
            f"interleaved schedule: {t.global_batch_size // (t.micro_batch_size * dp)} micro-batches not a "
            f"multiple of pp {pp}"
        )
    out += pipeline_split_problems(rc)
    if m.num_attention_heads % tp or (m.num_query_groups or m.num_attention_heads) % tp:
        out.append(f"heads {m.num_attention_heads} / query groups {m.num_query_groups} not divisible by tp {tp}")
    if cp > 1 and m.seq_length % (2 * cp):
        out.append(f"seq {m.seq_length} not divisible by 2*cp = {2 * cp}")
    if tp > 1 and not p.sequence_parallel:
        out.append("sequence_parallel must be on when tp > 1")
    if m.max_position_embeddings < m.seq_length:
        out.append("max_position_embeddings < seq_length")
    if m.num_moe_experts:
        if m.num_moe_experts % ep:
            out.append(f"ep {ep} does not divide {m.num_moe_experts} experts")
        if world(rc) % (etp * ep * pp):
            out.append(f"etp*ep*pp = {etp * ep * pp} does not divide world {world(rc)}")
        if not isinstance(m.moe_layer_freq, int) and len(m.moe_layer_freq) != m.num_layers:
            out.append("moe_layer_freq list length != num_layers")
    elif ep != 1:
        out.append("ep > 1 on a dense model")
    return out


def pipeline_split_problems(rc: RunConfig) -> list[str]:
    """Megatron-Core TransformerConfig's rules for splitting layers over (virtual) pipeline stages."""
    p, layers = rc.parallel, rc.model.num_layers
    if p.pipeline_model_parallel_layout is not None:
        return []  # the layout names each stage's layers: Megatron-Core's own check (test_config_megatron_names.py)
    pp, vp = p.pipeline_model_parallel_size, p.virtual_pipeline_model_parallel_size or 1
    first, last = p.num_layers_in_first_pipeline_stage, p.num_layers_in_last_pipeline_stage
    if first is not None or last is not None:
        middle_layers = layers - (first or 0) - (last or 0)
        middle_stages = pp - (first is not None) - (last is not None)
        ends_ok = all(n % vp == 0 for n in (first, last) if n is not None)
        ok = middle_stages > 0 and middle_layers % middle_stages == 0 and (middle_layers // middle_stages) % vp == 0
        return (
            []
            if ends_ok and (ok or middle_layers == middle_stages == 0)
            else [f"uneven split {first}/{last} of {layers} layers over pp {pp} vp {vp}"]
        )
    layers += p.account_for_embedding_in_pipeline_split + p.account_for_loss_in_pipeline_split
    return [] if layers % (pp * vp) == 0 else [f"{layers} layers not divisible by pp*vp = {pp * vp}"]


def test_every_recipe_composes_into_a_run_config(all_recipes: dict[str, RunConfig]) -> None:
    assert set(all_recipes) == set(recipe_catalog())
    for name, rc in all_recipes.items():
        assert isinstance(rc, RunConfig)
        assert rc.recipe.name == name, f"{name}: recipe.name is {rc.recipe.name!r}"
        assert rc.recipe.family == recipe_catalog()[name].parent.name
        assert rc.recipe.description, f"{name}: no description"
        assert rc.cluster.gpu in GPU_KEYS, f"{name}: unknown GPU {rc.cluster.gpu!r}"


def test_every_recipe_names_its_published_models_and_the_families_exist(all_recipes: dict[str, RunConfig]) -> None:
    for name in (
        "llama3_8b",
        "llama3_70b",
        "llama31_405b",
        "gpt3_175b",
        "mixtral_8x7b",
        "deepseek_v3",
        "moe_10t",
        "tiny_gpt",
        "tiny_moe",
    ):
        assert name in all_recipes
    assert all_recipes["moe_10t"].recipe.family == "scale"


@pytest.mark.parametrize("name", sorted(recipe_catalog()))
def test_layout_divides(name: str, all_recipes: dict[str, RunConfig]) -> None:
    assert layout_problems(all_recipes[name]) == []


def test_layout_check_catches_a_broken_layout(all_recipes: dict[str, RunConfig]) -> None:
    """The rules above are not vacuous: a wrong PP, TP or batch is reported."""
    import dataclasses

    rc = all_recipes["llama3_70b"]
    bad_pp = dataclasses.replace(rc, parallel=dataclasses.replace(rc.parallel, pipeline_model_parallel_size=3))
    assert any("world" in s for s in layout_problems(bad_pp))
    bad_vp = dataclasses.replace(rc, parallel=dataclasses.replace(rc.parallel, virtual_pipeline_model_parallel_size=3))
    assert any("pp*vp" in s for s in layout_problems(bad_vp))
    bad_gbs = dataclasses.replace(rc, trainer=dataclasses.replace(rc.trainer, global_batch_size=100))
    assert any("gbs" in s for s in layout_problems(bad_gbs))


def filled(row: dict, field: str, value: object) -> object:
    """A row's value of ``field``, or the policy's default when the row leaves an unstated fact empty."""
    return DEFAULTS[field] if value is None and field in row.get("unstated", ()) else value


def row_matches(row: dict, rc: RunConfig) -> bool:
    """Model, layout, batch, GPU count and precision of a recipe equal the row's (unverified fields skipped)."""
    m, p, t = rc.model, rc.parallel, rc.trainer
    rm, rp, rb = row["model"], row["parallel"], row["batch"]
    want = {
        "layers": (rm["layers"], m.num_layers), "hidden": (rm["hidden"], m.hidden_size),
        "heads": (rm["heads"], m.num_attention_heads), "kv_heads": (rm["kv_heads"], m.num_query_groups),
        "ffn": (rm["ffn"], m.ffn_hidden_size), "gated": (rm["gated_mlp"], m.gated_linear_unit),
        "vocab": (rm["vocab"], m.vocab_size), "seq": (rm["seq"], m.seq_length),
        "gbs": (rb["gbs"], t.global_batch_size), "mbs": (filled(row, "batch.mbs", rb["mbs"]), t.micro_batch_size),
        "gpus": (row["gpus"], world(rc)), "gpu": (row["gpu"], rc.cluster.gpu),
        "precision": (row["precision"], "fp8" if rc.precision.fp8 else "bf16" if rc.precision.bf16
                      else "fp16" if rc.precision.fp16 else "fp32"),
    }  # fmt: skip
    if isinstance(rp, dict):
        dp = world(rc) // (p.tensor_model_parallel_size * p.pipeline_model_parallel_size * p.context_parallel_size)
        want.update({
            "tp": (rp["tp"], p.tensor_model_parallel_size), "pp": (rp["pp"], p.pipeline_model_parallel_size),
            "vp": (rp["vp"], p.virtual_pipeline_model_parallel_size), "cp": (rp["cp"], p.context_parallel_size),
            "ep": (rp["ep"], p.expert_model_parallel_size), "dp": (rp["dp"], dp),
        })  # fmt: skip
        if rp.get("fsdp"):
            want["fsdp"] = (True, p.use_distributed_optimizer)
    return all(published == ours for published, ours in want.values() if published != "unverified")


RECIPE_ROWS = 15
"""Published rows with a recipe that reproduces them (the first calibration set); later rows are scored
by ``kilocard baselines`` from the row alone."""


def test_every_recipe_with_a_baseline_reproduces_its_row_exactly(all_recipes: dict[str, RunConfig]) -> None:
    rows = {row["id"]: row for row in published_rows()}
    claimed = {n: rc for n, rc in all_recipes.items() if rc.recipe.baseline_id}
    assert len(claimed) >= RECIPE_ROWS
    for name, rc in claimed.items():
        row = rows[rc.recipe.baseline_id]
        matches = [n for n, other in all_recipes.items() if row_matches(row, other)]
        assert matches == [name], f"row {row['id']}: recipes matching {matches}"
        assert name == row["id"].replace("-", "_").replace(".", "_")
        assert rc.recipe.baseline_id == row["id"]
        assert rc.recipe.baseline_source == row["source"]
        result = row["result"]
        assert rc.recipe.baseline_tflops_per_gpu == result.get("tflops_per_gpu")
        assert rc.recipe.baseline_mfu == result.get("mfu")
        if row["flops_convention"] != "unverified":
            assert rc.recipe.baseline_flops_convention == row["flops_convention"]
        recompute = filled(row, "recompute", row.get("recompute"))
        if recompute == "full":
            assert (
                rc.parallel.recompute_granularity,
                rc.parallel.recompute_method,
                rc.parallel.recompute_num_layers,
            ) == ("full", "uniform", 1)
        if recompute == "none":
            assert rc.parallel.recompute_granularity is None


def test_every_baseline_id_names_a_published_row(all_recipes: dict[str, RunConfig]) -> None:
    ids = {row["id"] for row in published_rows()}
    claimed = [rc.recipe.baseline_id for rc in all_recipes.values() if rc.recipe.baseline_id]
    assert set(claimed) <= ids
    assert len(claimed) == len(set(claimed))  # one recipe per row at most


@pytest.mark.parametrize(
    "recipe, total, active",
    [
        ("llama3_8b", 8.03e9, None),
        ("llama3_70b", 70.6e9, None),
        ("llama31_405b", 405.9e9, None),
        ("gpt3_175b", 175e9, None),
        ("mixtral_8x7b", 46.7e9, 12.9e9),
        ("deepseek_v3", 671e9, 37e9),
        ("kimi_k2", 1.04e12, 32e9),  # Kimi K2 technical report: 1.04T total, 32B activated
        ("moe_10t", 10e12, 500e9),
        ("qwen3_8b", 8.2e9, None),  # Qwen3 technical report, arXiv:2505.09388, Table 1 / model cards
        ("bridge260401_h100_qwen3_30b_fp8", 30.5e9, 3.3e9),
        ("bridge260401_h100_qwen3_235b_fp8", 235e9, 22e9),
        # OpenAI's gpt-oss model card: 116.83B total, 5.13B active without the 0.58B input embedding
        ("gpt_oss_120b", 116.83e9, 5.13e9 + 201088 * 2880),
    ],
)
def test_parameter_counts_match_the_published_figures(
    recipe: str, total: float, active: float | None, all_recipes
) -> None:
    count = count_parameters(all_recipes[recipe].model)
    # Qwen publishes one decimal (3.3B active is 3.35B)
    tol = 0.03 if recipe in ("moe_10t", "deepseek_v3", "kimi_k2", "gpt3_175b") else 0.02 if "qwen3" in recipe else 0.005
    assert count.total == pytest.approx(total, rel=tol)
    assert count.active == pytest.approx(active or total, rel=tol)


def test_moe_10t_fills_500k_gpus(all_recipes: dict[str, RunConfig]) -> None:
    rc = all_recipes["moe_10t"]
    assert (rc.cluster.name, rc.cluster.nodes, world(rc)) == ("h100_dgx", 62500, 500_000)


@pytest.mark.integration  # runs the kilocard console script
def test_kilocard_recipes_prints_every_recipe(all_recipes: dict[str, RunConfig], tmp_path: Path, monkeypatch) -> None:
    """The table (summarised here, then read from its cache by real ``kilocard recipes`` processes)
    lists every recipe with its GPU count and baseline."""
    monkeypatch.setenv("KILOCARD_CACHE_DIR", str(tmp_path / "cache"))
    rows = catalog_rows(composed=all_recipes)  # the fixture composed them already: summarise and cache
    assert rows == [recipe_row(n, rc) for n, rc in all_recipes.items()]
    assert len(list((tmp_path / "cache").glob("catalog-*.json"))) == 1
    assert catalog_rows() == rows  # read back from the cache
    env = {**os.environ, "KILOCARD_CACHE_DIR": str(tmp_path / "cache"), "TMPDIR": str(tmp_path)}
    cmd = [sys.executable, "-m", "kilocard.cli", "recipes"]
    as_json = subprocess.run([*cmd, "--format", "json"], env=env, capture_output=True, text=True, timeout=60)
    assert as_json.returncode == 0, as_json.stderr
    assert [r["name"] for r in json.loads(as_json.stdout)] == list(all_recipes)
    text = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    lines = text.stdout.splitlines()
    assert lines[0].split()[:4] == ["recipe", "family", "model", "params"]
    for name, rc in all_recipes.items():
        line = next(line for line in lines if line.split()[0] == name)
        assert str(world(rc)) in line.split() and (rc.recipe.baseline_id or "-") in line.split()


def test_every_recipe_passes_the_validator(all_recipes: dict[str, RunConfig]) -> None:
    """No shipped recipe has an error under kilocard's own validator (memory, topology, batch...)."""
    from kilocard.validate import validate

    failing = {name: [f"{i.code}: {i.message}" for i in validate(rc).errors] for name, rc in all_recipes.items()}
    assert {name: errs for name, errs in failing.items() if errs} == {}


#: Where a recipe deliberately runs something other than its published row, by recipe and field, with the
#: reason its own header states. Everything else of the layout, batch, model shape and precision is compared.
RECIPE_ROW_DIFFERENCES = {
    "bridge_llama3_8b_fp8": {
        "parallel.use_megatron_fsdp": "kilocard's trainer does not build Megatron-FSDP: the distributed optimizer",
        "parallel.data_parallel_sharding_strategy": "the same",
    },
    **{
        name: {
            "parallel.use_megatron_fsdp": "NeMo AutoModel's FSDP2: the distributed optimizer stands in (recipe header)",
            "parallel.data_parallel_sharding_strategy": "the same",
        }
        for name in (
            "automodel_h100_dsv3_1024_bf16",
            "automodel_h100_dsv3_256_bf16",
            "automodel_h100_kimi_k2_256_bf16",
            "automodel_h100_qwen3_30b_8_bf16",
        )
    },
    **{
        f"sc21_{size}": {"parallel.sequence_parallel": "the 2021 layouts on today's Megatron-Core (the row: 2021's)"}
        for size in ("3_6b", "7_5b", "18b", "39b", "76b", "145b", "310b", "530b", "1t")
    },
}
SHAPE_FIELDS = (
    "num_layers", "hidden_size", "num_attention_heads", "num_query_groups", "ffn_hidden_size", "seq_length",
    "vocab_size", "gated_linear_unit", "num_moe_experts", "moe_router_topk", "moe_ffn_hidden_size",
    "share_embeddings_and_output_weights", "position_embedding_type", "mtp_num_layers",
)  # fmt: skip
PRECISION_FIELDS = ("bf16", "fp16", "fp8", "fp8_recipe", "fp4")


def test_a_recipe_and_its_published_row_make_the_same_run(all_recipes: dict[str, RunConfig]) -> None:
    """The row's conversion (``perf.baselines.row_run_config``: what ``kilocard baselines`` predicts and the
    validator checks) and the recipe agree on every parallel field, the batch, the GPUs, the model's shape
    and the precision, except the differences each recipe states (``RECIPE_ROW_DIFFERENCES``)."""
    from kilocard.calibration.baselines import load_rows, row_run_config

    rows = {r.id: r for r in load_rows()}
    compared = 0
    for name, rc in all_recipes.items():
        row = rows.get(rc.recipe.baseline_id or "")
        if row is None or not row.complete:
            continue
        cfg, allowed = row_run_config(row), RECIPE_ROW_DIFFERENCES.get(name, {})
        fields = [("parallel", f.name) for f in dataclasses.fields(rc.parallel)]
        fields += [("model", f) for f in SHAPE_FIELDS] + [("precision", f) for f in PRECISION_FIELDS]
        fields += [("trainer", "micro_batch_size"), ("trainer", "global_batch_size"), ("cluster", "gpu")]
        differ = {
            f"{g}.{f}": (getattr(getattr(rc, g), f), getattr(getattr(cfg, g), f))
            for g, f in fields
            if getattr(getattr(rc, g), f) != getattr(getattr(cfg, g), f) and f"{g}.{f}" not in allowed
        }
        assert not differ, f"recipe {name} vs row {row.id}: {differ}"
        assert world(rc) == world(cfg)
        compared += 1
    assert compared >= 13
