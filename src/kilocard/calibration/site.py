"""A site's own runs as calibration rows: the performance model learns the cluster it plans for.

``site_row`` writes a finished run as a row of the published file's format (model, layout, batch,
precision, GPU count, the measured TFLOP/s per GPU, provenance). Every fact of the run's config that the
row format does not carry goes into the row's ``software:`` (ParallelConfig/ModelConfig/PrecisionConfig
names) and ``cluster:`` (the site profile's sizes and bandwidths) mappings, so the one conversion
``baselines.row_run_config`` gives back a config the model predicts exactly as it predicted the run.

``site_fit`` refits the model's free parameters (``fit.FREE``, the same physical parameters, no per-row
or per-source factor) on the published rows plus the site rows, starting from the shipped values. The
site rows together weigh ``SITE_WEIGHT`` times the published rows together: they describe the cluster
being planned, so where they constrain a parameter they decide it, while the published rows keep the
parameters the site rows do not reach where they were and break ties between values the site rows
cannot tell apart (a handful of site rows beside 114 published ones at equal weight would move the
shared parameters only half way). It also gives each site row's leave-one-out error: the row predicted
by a refit without it. The result is cached under ``paths.cache_dir()`` by the content of both files and
the model's parameters.
"""

from __future__ import annotations

import hashlib
import json
import os
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import yaml

from kilocard.base.safe_read import FileReadError, decode, read_bytes, read_json, read_yaml
from kilocard.calibration.baselines import Row, _row, baselines_file, load_rows, row_cluster, row_run_config
from kilocard.calibration.fit import FREE, Target, coordinate_search, fit, targets
from kilocard.config.schema import RunConfig
from kilocard.paths import cache_dir
from kilocard.perf.efficiency import FITTED, PerfModelParams, flat, with_values
from kilocard.perf.predict import gpu_family, precision_of, step_layout
from kilocard.topology import gpu_spec

SITE_WEIGHT = 4.0
"""The site rows' total weight in the refit's loss, relative to the published rows' total."""
FIT_EVALS = 1200
"""Loss evaluations of the site refit's coordinate search (from the shipped values)."""
LOO_EVALS = 200
"""Loss evaluations of each leave-one-out refit (from the site refit's values)."""
SITE_HEADER = (
    "# A site's own measured runs, in the format of kilocard's baselines/published.yaml\n"
    "# (kilocard baselines --site FILE --add RUN_DIR appends; perf.site_baselines=FILE uses them).\n"
)
SCALAR = (int, float)


@dataclass(frozen=True)
class SiteFit:
    """The model refitted on the published rows plus a site's rows, and how well it predicts the site."""

    file: str
    """The site baselines file."""
    values: dict[str, dict[str, float]]
    """The refitted free parameters of each device family of the site rows (``hopper``, ``cpu``...): each refit
    on the published rows and the site rows of that family only."""
    rows: int
    """Scored site rows."""
    loo_errors: dict[str, float]
    """Each site row's relative error under a refit without it (row id -> error)."""
    shipped_errors: dict[str, float]
    """Each site row's relative error under the shipped fit (what the site rows change)."""

    def params_for(self, gpu: str) -> PerfModelParams:
        """The parameters that predict ``gpu`` (``cluster.gpu``): its family's refit when the site has rows of that
        family, else the shipped fit. Rows of another device never move a GPU's parameters (CPU-rank rows once
        took the H100 prediction for llama3_70b from 495 to 288 TFLOP/s)."""
        family = family_of(gpu)
        return with_values(FITTED, self.values[family]) if family in self.values else FITTED

    def summary(self) -> str:
        """One line: the site rows' leave-one-out error beside their error under the shipped fit."""
        loo = [abs(e) for e in self.loo_errors.values()]
        shipped = [abs(e) for e in self.shipped_errors.values()]
        return (
            f"site rows ({self.file}): {self.rows}, each predicted by a refit without it: mean "
            f"{statistics.fmean(loo):.1%}, max {max(loo):.1%} (shipped fit: mean {statistics.fmean(shipped):.1%}, "
            f"max {max(shipped):.1%})"
        )

    def to_json(self) -> dict[str, Any]:
        """``site_fit`` in ``plan``/``validate`` JSON."""
        loo = [abs(e) for e in self.loo_errors.values()]
        return {
            "file": self.file,
            "rows": self.rows,
            "loo_mean_abs_rel_error": statistics.fmean(loo),
            "loo_max_abs_rel_error": max(loo),
            "loo_rel_errors": self.loo_errors,
            "shipped_rel_errors": self.shipped_errors,
            "values": self.values,
        }


def _model_facts(cfg: RunConfig) -> dict[str, Any]:
    m = cfg.model
    out: dict[str, Any] = {
        "layers": m.num_layers,
        "hidden": m.hidden_size,
        "heads": m.num_attention_heads,
        "kv_heads": m.num_query_groups,
        "ffn": m.ffn_hidden_size,
        "gated_mlp": m.gated_linear_unit,
        "vocab": m.vocab_size,
        "seq": m.seq_length,
    }
    if m.num_moe_experts:
        out.update(experts=m.num_moe_experts, topk=m.moe_router_topk, moe_ffn=m.moe_ffn_hidden_size)
    return out


def _recompute(cfg: RunConfig) -> str:
    return cfg.parallel.recompute_granularity or "none"


def _differing(base: object, run: object, only_scalars: bool = False) -> dict[str, Any]:
    """The fields of dataclass ``run`` whose values differ from ``base``'s."""
    out = {}
    for f in fields(base):  # type: ignore[arg-type]
        a, b = getattr(base, f.name), getattr(run, f.name)
        if a != b and (not only_scalars or isinstance(b, SCALAR)):
            out[f.name] = list(b) if isinstance(b, tuple) else b
    return out


def site_row(cfg: RunConfig, row_id: str, tflops_per_gpu: float, convention: str, provenance: dict) -> dict:
    """The published-format row of a run with frozen config ``cfg`` that measured ``tflops_per_gpu``."""
    lay = step_layout(cfg)
    raw: dict[str, Any] = {
        "id": row_id,
        "source": f"site runs of {cfg.cluster.name}: {provenance.get('run_dir', row_id)}",
        "gpu": cfg.cluster.gpu,
        "gpus": lay.world_size,
        "model": _model_facts(cfg),
        "parallel": {"tp": lay.tp, "pp": lay.pp, "vp": lay.vp or None, "cp": lay.cp, "ep": lay.ep, "dp": lay.dp},
        "batch": {"gbs": cfg.trainer.global_batch_size, "mbs": cfg.trainer.micro_batch_size},
        "recompute": _recompute(cfg),
        "precision": precision_of(cfg),
        "flops_convention": convention,
        "result": {"tflops_per_gpu": float(tflops_per_gpu)},
        "provenance": provenance,
    }
    if cfg.cluster.gpu == "cpu":
        raw["hardware_note"] = "CPU ranks (gloo): a local run, not a GPU measurement"
    raw["cluster"] = _differing(row_cluster(raw), cfg.cluster, only_scalars=True)
    raw["cluster"].pop("name", None)
    base = row_run_config(_row(raw, 0, "site"))
    software: dict[str, Any] = {}
    for group in ("model", "parallel", "precision"):
        software.update(_differing(getattr(base, group), getattr(cfg, group)))
    software.pop("name", None)
    raw["software"] = software
    return raw


def _identity(raw: Any) -> tuple[str, ...]:
    """What makes a row the measurement of one run: its ``provenance.run_identity`` (rows written before it was
    recorded: the resolved run directory and config sha256)."""
    prov = raw.get("provenance") if isinstance(raw, dict) else None
    if not isinstance(prov, dict):
        return ()
    if prov.get("run_identity"):
        return ("identity", str(prov["run_identity"]))
    if not prov.get("run_dir"):
        return ()
    return ("dir", str(prov.get("run_dir")), str(prov.get("config_sha256")))


def site_rows(file: Path, name: str, then: str = "") -> list[Row]:
    """The rows of a site baselines ``file`` (the published file's loader), a fault of it said under ``name``,
    the option or field that named the file (``--site``, ``perf.site_baselines``), not the loader's ``--file``."""
    try:
        return load_rows(str(file))
    except ValueError as e:
        raise ValueError(f"{name}: {str(e).removeprefix('--file: ')}{then}") from None


def _existing_rows(file: Path) -> tuple[str, list[Any]]:
    """The text of the site ``file`` and its rows, after the loader ``perf.site_baselines`` uses accepted them: a
    row is never appended to a file that the refit would then refuse."""
    try:
        text = decode(file, read_bytes(file))
    except FileReadError as e:
        raise ValueError(f"--site: {e}; fix the file first (perf.site_baselines refuses it too)") from None
    site_rows(file, "--site", "; fix the file first (perf.site_baselines refuses it too)")
    doc = read_yaml(file, dict)
    return text, doc["rows"]


def _appended(file: Path, text: str, rows: list[Any], row: dict) -> Path:
    """A temporary sibling of ``file`` holding ``text`` with ``row`` added as the last item of its ``rows:`` list,
    every other byte (comments, order, spelling) kept; the indentation is the list's own, checked by reading the
    result back (the safe reader) before it may replace ``file``."""
    base = text if text.endswith("\n") or not text else text + "\n"
    item = yaml.safe_dump([row], sort_keys=False, default_flow_style=None)
    tmp = file.with_name(f".{file.name}.tmp-{os.getpid()}")
    for indent in dict.fromkeys([*_item_indents(text), 0, 2]):
        pad = " " * indent
        tmp.write_text(base + "".join(pad + line if line.strip() else line for line in item.splitlines(keepends=True)))
        try:
            doc = read_yaml(tmp, (dict, list, str, type(None)))
        except FileReadError:
            continue
        if isinstance(doc, dict) and doc.get("rows") == [*rows, row]:
            return tmp
    tmp.unlink(missing_ok=True)
    raise ValueError(
        "--site: the new row cannot be appended in place: 'rows:' is not the file's last entry written as a block "
        "list; move it last (one '- id: ...' item per row)"
    )


def _item_indents(text: str) -> list[int]:
    """Columns at which the file's list items (``- id:``) start."""
    return [len(line) - len(line.lstrip(" ")) for line in text.splitlines() if line.lstrip(" ").startswith("- id:")]


def append_row(file: Path, row: dict) -> str:
    """Append ``row`` to the site baselines ``file`` (created when absent) in place: the existing text, comments
    included, stays as it is and the row is added after it, atomically (a temporary file renamed). The file is
    checked first: a malformed one, or one that holds this run already (by its identity, not its directory name),
    is refused and left as it was. A row whose id another run's row holds gets the identity's first digits after
    it. Returns the row's id."""
    rows: list[Any] = []
    text = SITE_HEADER + "rows:\n"
    if file.exists():
        text, rows = _existing_rows(file)
        mine = _identity(row)
        twin = next((r for r in rows if mine and _identity(r) == mine), None)
        if twin is not None:
            raise ValueError(f"--site: {file} already holds this run as row {twin.get('id')!r} (it was added before)")
        if any(isinstance(r, dict) and r.get("id") == row["id"] for r in rows):
            if not mine:
                raise ValueError(f"--site: {file} already holds a row {row['id']!r}")
            row = {**row, "id": f"{row['id']}-{hashlib.sha256(repr(mine).encode()).hexdigest()[:8]}"}
    _row(row, len(rows), file.name)  # the loader accepts it, or nothing is written
    try:
        os.replace(_appended(file, text, rows, row), file)
    finally:
        file.with_name(f".{file.name}.tmp-{os.getpid()}").unlink(missing_ok=True)
    return str(row["id"])


def _key(published: Path, site: Path) -> str:
    h = hashlib.sha256()
    parts = (read_bytes(published), read_bytes(site), repr(FREE), repr(sorted(flat(FITTED).items())), "per-family")
    for part in parts:
        h.update(part if isinstance(part, bytes) else part.encode())
        h.update(b"\0")
    return h.hexdigest()[:24]


@dataclass(frozen=True)
class _Weighted:
    """A row whose error counts ``weight`` times in the fit's mean |error| (``fit.loss`` calls ``rel_error``)."""

    target: Target
    weight: float

    def rel_error(self, params: PerfModelParams) -> float:
        return self.weight * self.target.rel_error(params)


def _weighted(published: Sequence[Target], site: Sequence[Target]) -> list[Any]:
    """Both sets, the site rows' errors scaled so that together they weigh ``SITE_WEIGHT`` times the published."""
    weight = SITE_WEIGHT * len(published) / max(1, len(site))
    return [*published, *(_Weighted(t, weight) for t in site)]


def family_of(gpu: str) -> str:
    """The efficiency family (``hopper``, ``cpu``...) of GPU table entry ``gpu``; its own name when unknown."""
    spec = gpu_spec(gpu)
    return gpu_family(spec) if spec is not None else gpu


def refit(published: Sequence[Target], site: Sequence[Target], file: str) -> SiteFit:
    """For each device family of the site rows, the refit on the published rows and that family's site rows,
    and each site row's leave-one-out error within its family (no cache)."""
    by_family: dict[str, list[Target]] = {}
    for t in site:
        by_family.setdefault(family_of(t.inputs.hardware.gpu), []).append(t)
    values: dict[str, dict[str, float]] = {}
    loo: dict[str, float] = {}
    for family, rows in by_family.items():
        values[family] = fit(_weighted(published, rows), starts=1, evals=FIT_EVALS)
        groups = [g for g in FREE if g[0] in values[family]]
        for i, t in enumerate(rows):
            rest = [r for j, r in enumerate(rows) if j != i]
            trial = coordinate_search(values[family], _weighted(published, rest), groups, LOO_EVALS) if rest else {}
            loo[t.row.id] = t.rel_error(with_values(FITTED, trial))
    return SiteFit(
        file=file,
        values=values,
        rows=len(site),
        loo_errors=loo,
        shipped_errors={t.row.id: t.rel_error(FITTED) for t in site},
    )


def site_fit(site_file: str, published_file: str | None = None) -> SiteFit:
    """``refit`` of the site file's scored rows beside the published ones, cached by the files' content.
    A file that cannot be read or holds no scored row is a one-line ``ValueError``."""
    site, published = Path(site_file), baselines_file(published_file)
    if not site.is_file():
        raise ValueError(f"perf.site_baselines: {site_file} is not a file (write one with kilocard baselines --add)")
    rows = targets(site_rows(site, "perf.site_baselines"))
    if not rows:
        raise ValueError(f"perf.site_baselines: {site_file} holds no scored row")
    key = _key(published, site)
    if key in _MEMO:
        return _MEMO[key]
    _MEMO[key] = result = _cached_refit(key, published_file, rows, site_file)
    return result


_MEMO: dict[str, SiteFit] = {}
"""Refits already computed or read in this process (``validate`` prints and reports the same one)."""


def _cached_refit(key: str, published_file: str | None, rows: Sequence[Target], site_file: str) -> SiteFit:
    cached = cache_dir() / f"site-fit-{key}.json"
    if cached.is_file():
        try:
            return SiteFit(**read_json(cached, dict))
        except (FileReadError, ValueError, TypeError):
            pass  # a damaged cache entry is recomputed and written again
    result = refit(targets(load_rows(published_file)), rows, site_file)
    cached.parent.mkdir(parents=True, exist_ok=True)
    tmp = cached.with_name(f".{cached.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(result.__dict__))
    os.replace(tmp, cached)
    return result
