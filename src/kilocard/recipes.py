"""The recipe catalog: every ``recipes/<family>/<name>.yaml``, composed, as a table."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import List, Optional

from kilocard.config.compose import compose_each, recipe_catalog, to_run_config
from kilocard.config.schema import RunConfig
from kilocard.perf.params import count_parameters


@dataclass(frozen=True)
class RecipeRow:
    """One line of ``kilocard recipes``."""

    name: str
    """Recipe name (``recipe=<name>``)."""
    family: str
    """Folder under ``recipes/``."""
    model: str
    """Model name."""
    params: int
    """Total parameters."""
    active_params: int
    """Parameters active per token (differs from ``params`` for MoE)."""
    gpus: int
    """nodes x gpus_per_node of the recipe's cluster."""
    cluster: str
    """Cluster profile."""
    precision: str
    """fp32, bf16, fp16, or fp8 (<format>)."""
    baseline: Optional[str]
    """Published baseline row it reproduces."""


def precision_label(cfg: RunConfig) -> str:
    """Short name of a run's numeric format."""
    p = cfg.precision
    if p.fp4:
        return f"fp4 ({p.fp4})"
    if p.fp8:
        return f"fp8 ({p.fp8_recipe})"
    return "bf16" if p.bf16 else "fp16" if p.fp16 else "fp32"


def catalog_rows() -> List[RecipeRow]:
    """Compose every recipe and summarise it."""
    names = list(recipe_catalog())
    rows = []
    for name, cfg in zip(names, compose_each([[f"recipe={n}"] for n in names])):
        rc = to_run_config(cfg)
        count = count_parameters(rc.model)
        rows.append(
            RecipeRow(
                name=name,
                family=recipe_catalog()[name].parent.name,
                model=rc.model.name,
                params=count.total,
                active_params=count.active,
                gpus=rc.cluster.nodes * rc.cluster.gpus_per_node,
                cluster=rc.cluster.name,
                precision=precision_label(rc),
                baseline=rc.recipe.baseline_id,
            )
        )
    return rows


def human(n: float) -> str:
    """1.2T / 70.6B / 8.0M style."""
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.1f}{unit}"
    return str(int(n))


def print_recipe_table(fmt: str = "text") -> int:
    """Print the catalog as a table or JSON; return the exit code."""
    rows = catalog_rows()
    if fmt == "json":
        print(json.dumps([r.__dict__ for r in rows], indent=1))
        return 0
    header = ("recipe", "model", "params", "active", "GPUs", "cluster", "precision", "baseline")
    table = [header] + [
        (r.name, r.model, human(r.params), human(r.active_params), str(r.gpus), r.cluster, r.precision, r.baseline or "-")
        for r in rows
    ]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    for i, row in enumerate(table):
        print("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
        if i == 0:
            print("  ".join("-" * w for w in widths))
    return 0
