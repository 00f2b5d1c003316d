"""The recipe catalog: every ``recipes/<family>/<name>.yaml`` (shipped and ``KILOCARD_CONFIG_PATH``'s), composed,
as a table.

Composing a recipe through Hydra costs about a quarter of a second, so the table is cached on disk
under a key that hashes every config and recipe file and the code the table depends on: any edit
to either (or to a site directory's files) recomputes it. ``KILOCARD_CACHE_DIR`` moves the cache (default
``$XDG_CACHE_HOME/kilocard`` or ``~/.cache/kilocard``).
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from kilocard.base.safe_read import FileReadError, read_bytes, read_json
from kilocard.config.compose import ComposeError, compose_each, recipe_catalog, to_run_config
from kilocard.config.schema import RunConfig
from kilocard.config.searchpath import env_site_dirs
from kilocard.layout import world_size
from kilocard.paths import cache_dir, data_dir
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
    baseline: str | None
    """Published baseline row it reproduces."""
    published_tflops_per_gpu: float | None = None
    """The row's published TFLOP/s per GPU (in ``published_convention``), when it states one."""
    published_mfu: float | None = None
    """The row's published MFU, when it states one."""
    published_convention: str | None = None
    """The FLOPs convention of the published figures."""

    @property
    def published(self) -> str:
        """The published figure in a few characters (``433 TF/s 44%``), ``-`` without one."""
        parts = []
        if self.published_tflops_per_gpu is not None:
            parts.append(f"{self.published_tflops_per_gpu:.0f} TF/s")
        if self.published_mfu is not None:
            parts.append(f"{self.published_mfu:.0%}")
        return " ".join(parts) or "-"


def precision_label(cfg: RunConfig) -> str:
    """Short name of a run's numeric format."""
    p = cfg.precision
    if p.fp4:
        return f"fp4 ({p.fp4})"
    if p.fp8:
        return f"fp8 ({p.fp8_recipe})"
    return "bf16" if p.bf16 else "fp16" if p.fp16 else "fp32"


def recipe_row(name: str, rc: RunConfig) -> RecipeRow:
    """Summarise one composed recipe."""
    count = count_parameters(rc.model)
    return RecipeRow(
        name=name,
        family=recipe_catalog()[name].parent.name,
        model=rc.model.name,
        params=count.total,
        active_params=count.active,
        gpus=world_size(rc.cluster),
        cluster=rc.cluster.name,
        precision=precision_label(rc),
        baseline=rc.recipe.baseline_id,
        published_tflops_per_gpu=rc.recipe.baseline_tflops_per_gpu,
        published_mfu=rc.recipe.baseline_mfu,
        published_convention=rc.recipe.baseline_flops_convention,
    )


def compose_recipes(names: Sequence[str]) -> list[RunConfig]:
    """Compose each named recipe (no overrides); a broken recipe is named in the error."""
    try:
        return [to_run_config(cfg) for cfg in compose_each([[f"recipe={n}"] for n in names])]
    except ComposeError as batch_error:
        first_error = batch_error  # find which recipe failed, below, so the message can name it
    for name in names:
        try:
            to_run_config(compose_each([[f"recipe={name}"]])[0])
        except ComposeError as e:
            raise ComposeError(f"recipe {name}: {e}", field=e.field, value=e.value) from None
    raise first_error


def _hashed_folders() -> list[tuple[str, Path]]:
    """(label, folder) of every config source: shipped ``conf`` and ``recipes``, each ``KILOCARD_CONFIG_PATH`` dir."""
    shipped = [(folder, data_dir(folder)) for folder in ("conf", "recipes")]
    return shipped + [(str(site), site) for site in env_site_dirs()]


def _cache_key() -> str:
    """Hash of every file the table depends on: configs, recipes (shipped and site) and the code that
    summarises them."""
    h = hashlib.sha256()
    for label, root in _hashed_folders():
        for path in sorted(root.rglob("*.yaml")):
            h.update(f"{label}/{path.relative_to(root)}\0".encode())
            h.update(read_bytes(path))
    config_modules = ("compose", "searchpath", "schema")
    modules = (*(f"kilocard.config.{m}" for m in config_modules), "kilocard.perf.params", __name__)
    for module in modules:
        h.update(read_bytes(Path(importlib.import_module(module).__file__ or "")))
    return h.hexdigest()[:20]


KEEP_CACHED_CATALOGS = 8
"""Catalog files kept in the cache directory (several checkouts may share it)."""


def _read_cache(path: Path) -> list[RecipeRow] | None:
    try:
        rows = [RecipeRow(**r) for r in read_json(path, list)]
    except (FileReadError, ValueError, TypeError):
        return None  # absent, unreadable or from another layout: a cache miss, recomputed
    return rows if [r.name for r in rows] == list(recipe_catalog()) else None


def _write_cache(path: Path, rows: list[RecipeRow]) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps([asdict(r) for r in rows]))
        os.replace(tmp, path)
        old = sorted(path.parent.glob("catalog-*.json"), key=lambda p: p.stat().st_mtime, reverse=True)
        for stale in old[KEEP_CACHED_CATALOGS:]:  # one file per edit of the configs: keep the newest few
            stale.unlink(missing_ok=True)
    except OSError as e:  # a read-only home only costs speed; say so once
        print(f"kilocard recipes: note: cannot cache the catalog in {path.parent} ({e.strerror})", file=sys.stderr)


def catalog_rows(use_cache: bool = True, composed: dict[str, RunConfig] | None = None) -> list[RecipeRow]:
    """Compose every recipe and summarise it (from the cache when nothing changed).

    ``composed`` passes recipes the caller already composed (``{name: RunConfig}``, every recipe),
    so they are summarised (and cached) without composing them again.
    """
    path = cache_dir() / f"catalog-{_cache_key()}.json"
    if use_cache and composed is None:
        cached = _read_cache(path)
        if cached is not None:
            return cached
    names = list(recipe_catalog())
    configs = [composed[n] for n in names] if composed is not None else compose_recipes(names)
    rows = [recipe_row(n, rc) for n, rc in zip(names, configs, strict=False)]
    if use_cache:
        _write_cache(path, rows)
    return rows


def human(n: float) -> str:
    """1.2T / 70.6B / 8.0M style."""
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.1f}{unit}"
    return str(int(n))


__all__ = [
    "RecipeRow",
    "catalog_rows",
    "compose_recipes",
    "precision_label",
    "human",
    "cache_dir",
]
