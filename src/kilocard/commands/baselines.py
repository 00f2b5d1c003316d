"""``kilocard baselines``: published MFU baselines against the performance model."""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

from kilocard.base.safe_read import FileReadError, read_json
from kilocard.base.table import text_table
from kilocard.calibration.baselines import (
    Comparison,
    Row,
    baselines_file,
    compare_all,
    error_stats,
    load_rows,
)
from kilocard.calibration.crossval import folds_file, load_fold_fits, with_cross_validation
from kilocard.calibration.fit import targets
from kilocard.calibration.series import render_series_text, series_checks, series_json
from kilocard.calibration.site import append_row, site_row
from kilocard.calibration.trust import Kind, by_kind, by_kind_lines, kind_json, traits
from kilocard.commands import exits
from kilocard.commands.output import fail
from kilocard.rundir import events
from kilocard.rundir.events import BadRecord
from kilocard.rundir.freeze import FrozenConfigError, load_verified
from kilocard.rundir.reproduction import NotSteady
from kilocard.rundir.reproduction import load as load_reproduction
from kilocard.rundir.targets import SITE_TYPES, WriteTargetError, one_writer, output_file
from kilocard.topology import GiB

HELP = "published MFU baselines vs the performance model"
#: Shown under ``kilocard baselines --help`` (each parsed by tests/commands/test_cli_help.py).
EXAMPLES = (
    "kilocard baselines",
    "kilocard baselines --format json",
    "kilocard baselines --site site.yaml --add runs/llama3_8b-20261203-101500",
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """``--file``, ``--format``, ``--site FILE --add RUN_DIR``."""
    p.add_argument("--file", default=None, help="a baselines YAML in the same format")
    p.add_argument("--format", choices=("text", "json"), default="text", help="a table (text) or one JSON document")
    p.add_argument("--site", metavar="FILE", help="a site baselines file (with --add: the file the run is added to)")
    p.add_argument("--add", metavar="RUN_DIR", help="add a finished run as a row of --site (created when absent)")


def add_run(site: Path, run_dir: Path) -> int:
    """``--site FILE --add RUN_DIR``: the run's steady-state TFLOP/s per GPU as a row of the site file."""
    output_file("--site", str(site), SITE_TYPES)  # before any work: a file kilocard may write
    if not run_dir.is_dir():
        return fail(
            "baselines", f"--add: {run_dir} is not a directory (expected a kilocard run directory)", exits.USAGE
        )
    try:
        cfg, sha = load_verified(run_dir)
        rep = load_reproduction(run_dir)
    except (FrozenConfigError, BadRecord) as e:
        return fail("baselines", f"--add: {e}", exits.USAGE)
    except NotSteady as e:
        return fail("baselines", f"--add: {run_dir} did not reach steady state: {e}; train more steps", exits.INVALID)
    starts = [e for e in events.read(run_dir) if e.get("event") == "start"]
    provenance = {
        "run_dir": str(run_dir.resolve()),
        "run_identity": run_identity(run_dir, sha, starts),
        "job_id": starts[-1].get("job_id") if starts else None,
        "code_version": _code_version(run_dir),
        "config_sha256": sha,
        "steps_used": len(rep.steps_used),
        "cpu_ranks": cfg.cluster.gpu == "cpu",
    }
    measured = rep.measured.tflops_per_gpu or 0.0
    row = site_row(cfg, f"site-{run_dir.name}", measured, rep.convention, provenance)
    try:
        with one_writer(site):
            row_id = append_row(site, row)
    except ValueError as e:
        return fail("baselines", str(e), exits.USAGE)
    except OSError as e:  # the folder or the file is not writable, the disk is full: the file is as it was
        why = f"cannot be written ({e.strerror or type(e).__name__})"
        raise WriteTargetError("--site", site, why, "choose a writable folder") from None
    kind = " (CPU ranks: marked cpu_ranks, a local run)" if provenance["cpu_ranks"] else ""
    steps = len(rep.steps_used)
    print(f"added {row_id} to {site}: {measured:.4g} TFLOP/s per GPU ({rep.convention}) over {steps} steps{kind}")
    return exits.OK


def run_identity(run_dir: Path, config_sha256: str, starts: list[dict]) -> str:
    """A run's identity whatever its directory is called or wherever a link to it points: its config sha256, when
    its run directory was created (``provenance.json``, written once) and when it first started (its first start
    event); two runs of one config differ in both, a symlink or a copy of a run agrees in all three."""
    try:
        created = read_json(run_dir / "provenance.json", dict).get("created")
    except FileReadError:
        created = None
    first = starts[0].get("time") if starts else None
    key = json.dumps([config_sha256, created, first, None if created or first else str(run_dir.resolve())])
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def _code_version(run_dir: Path) -> object:
    try:
        return read_json(run_dir / "provenance.json", dict)["submit_host"]["code"]
    except (FileReadError, KeyError, TypeError):
        return None


def execute(args: argparse.Namespace) -> int:
    """Print the comparison, in sample and cross-validated, and the scaling series; 2 on an unreadable
    baselines file. With ``--site FILE --add RUN_DIR``: add the run to the site file instead."""
    if args.add or args.site:
        if not (args.add and args.site):
            return fail("baselines", "--site FILE and --add RUN_DIR go together", exits.USAGE)
        return add_run(Path(args.site), Path(args.add))
    try:
        rows, file = load_rows(args.file), baselines_file(args.file)
        folds = load_fold_fits(file)
        if not folds:
            print(
                f"kilocard baselines: no stored fold fits ({folds_file(file)}): each fold is fitted from the middle "
                f"of the ranges (up to ~35 s a source; `scripts/fit_perf_model.py --file {file} --folds` stores them)",
                file=sys.stderr,
            )
        comps = with_cross_validation(compare_all(args.file), rows, folds)
    except (ValueError, KeyError, TypeError) as e:
        return fail("baselines", str(e), exits.USAGE)
    series = series_checks(rows, comps)
    kinds = kinds_of(rows, comps)
    if args.format == "json":
        doc = json.loads(render_json(comps))
        doc["series"] = series_json(series)
        doc["by_kind"] = [kind_json(k) for k in kinds]
        print(json.dumps(doc, indent=1))
    else:
        parts = (render_text(comps), "\n".join(by_kind_lines(kinds)), render_series_text(series))
        print("\n".join(part for part in parts if part))
    return exits.OK


def kinds_of(rows: list[Row], comps: list[Comparison]) -> list[Kind]:
    """The scored rows' errors by kind (GPU family, dense/MoE, GEMM width)."""
    kind = {t.row.id: traits(t.inputs) for t in targets(rows)}
    scored = [c for c in comps if c.rel_error is not None and c.id in kind]
    return by_kind([(kind[c.id], c.rel_error or 0.0, c.cv_rel_error) for c in scored])


# --- what baselines prints ------------------------------------------------------------------------


def _fmt(v: float | None, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def render_text(comps: list[Comparison]) -> str:
    """The table ``kilocard baselines`` prints."""
    header = (
        "row",
        "recipe",
        "convention",
        "pub TF/s",
        "pred TF/s",
        "pub MFU",
        "pred MFU",
        "peak",
        "error",
        "CV error",
        "mem GiB / HBM GiB",
    )
    lines = [header] + [
        (
            c.id,
            c.recipe or "-",
            c.convention,
            _fmt(c.published_tflops_per_gpu, ".0f"),
            _fmt(c.predicted_tflops_per_gpu, ".0f"),
            _fmt(c.published_mfu, ".1%"),
            _fmt(c.predicted_mfu, ".1%"),
            _fmt(c.peak_tflops, ".0f"),
            _fmt(c.rel_error, "+.1%") if c.rel_error is not None else "excluded",
            _fmt(c.cv_rel_error, "+.1%"),
            headroom(c),
        )
        for c in comps
    ]
    out = text_table(lines)
    stats = error_stats(comps)
    out.append("")
    out.append(
        f"in sample: mean |error| {stats['mean_abs_rel_error']:.1%}, max |error| {stats['max_abs_rel_error']:.1%} "
        f"over {stats['rows_included']} rows with full configurations (TFLOP/s per GPU, each row's own "
        f"FLOPs convention; MFU = TFLOP/s over the dense peak of the row's GEMM dtype)"
    )
    out.append(held_out_line(stats))
    out.append(memory_line(comps))
    for c in comps:
        if c.note:
            out.append(f"excluded from the statistics: {c.id} ({c.note})")
    return "\n".join(out)


def headroom(c: Comparison) -> str:
    """``mem / HBM`` in GiB: the memory estimate of the row's configuration against its GPU's memory."""
    if c.mem_bytes is None or not c.hbm_bytes:
        return "-"
    return f"{c.mem_bytes / GiB:.1f} / {c.hbm_bytes / GiB:.1f}"


def memory_line(comps: list[Comparison]) -> str:
    """The rows closest to and furthest from their GPU's memory (estimate over HBM)."""
    fits = [c for c in comps if c.mem_bytes is not None and c.hbm_bytes]
    if not fits:
        return "memory:    no row scored"
    share = {c.id: c.mem_bytes / c.hbm_bytes for c in fits if c.mem_bytes is not None and c.hbm_bytes}
    hi, lo = max(share, key=share.__getitem__), min(share, key=share.__getitem__)
    return (
        f"memory:    estimate / HBM from {share[lo]:.0%} ({lo}) to {share[hi]:.0%} ({hi}) over {len(share)} rows "
        "(`kilocard validate` refuses a layout above HBM less 3% and 1 GiB)"
    )


def held_out_line(stats: dict[str, float]) -> str:
    """The summary of the cross-validated errors."""
    if not stats["n_scored"]:
        return "held out:  no row scored (cross-validation needs rows with full configurations from two sources)"
    return (
        f"held out:  mean |error| {stats['cv_mean_abs_rel_error']:.1%}, max |error| "
        f"{stats['cv_max_abs_rel_error']:.1%} over {stats['n_scored']} rows (CV error: each source document "
        "left out of the fit in turn, its rows predicted by a fit on the others,"
        " started from values fitted without them)"
    )


def render_json(comps: list[Comparison]) -> str:
    """The ``--format json`` document."""
    stats = error_stats(comps)
    doc = {
        "rows": [
            {
                "id": c.id,
                "recipe": c.recipe,
                "convention": c.convention,
                "published_tflops_per_gpu": c.published_tflops_per_gpu,
                "predicted_tflops_per_gpu": c.predicted_tflops_per_gpu,
                "published_mfu": c.published_mfu,
                "predicted_mfu": c.predicted_mfu,
                "rel_error": c.rel_error,
                "cv_rel_error": c.cv_rel_error,
                "mem_bytes": c.mem_bytes,
                "hbm_bytes": c.hbm_bytes,
                "excluded": c.note or None,
            }
            for c in comps
        ],
        "mean_abs_rel_error": stats["mean_abs_rel_error"],
        "max_abs_rel_error": stats["max_abs_rel_error"],
        "rows_included": stats["rows_included"],
        "cv_mean_abs_rel_error": stats["cv_mean_abs_rel_error"],
        "cv_max_abs_rel_error": stats["cv_max_abs_rel_error"],
        "n_scored": stats["n_scored"],
    }
    return json.dumps(doc, indent=1)
