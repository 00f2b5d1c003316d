"""``kilocard plan``: rank the layouts the validator accepts by predicted throughput.

Exit 0 when at least one layout is accepted, 1 when none is, 2 on bad input.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from kilocard.calibration.trust import model_error_json, model_error_lines
from kilocard.commands import exits
from kilocard.commands.common import add_config_args, site_calibration
from kilocard.commands.output import fail
from kilocard.config.compose import compose, to_run_config
from kilocard.config.schema import RunConfig
from kilocard.planner.search import CONVENTION, OWN_MARK, Plan, Ranked, apply, plan, table_rows
from kilocard.rundir.targets import output_file, write_file
from kilocard.validate.packages import importable, install_hint

HELP = "rank the layouts that fit by predicted throughput"
#: Shown under ``kilocard plan --help`` (each parsed by tests/commands/test_cli_help.py).
EXAMPLES = ("kilocard plan recipe=llama3_70b cluster=h100_dgx cluster.nodes=8 --top 5",)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Overrides, ``--top``, ``--plot``, ``--format``."""
    add_config_args(p, multirun=False)
    p.add_argument("--top", type=int, default=10, help="how many layouts to list (default 10)")
    p.add_argument("--plot", default=None, metavar="PNG", help="also draw the ranking into this PNG (needs matplotlib)")
    p.add_argument("--format", choices=("text", "json"), default="text", help="a table (text) or one JSON document")


def schedule_path(plot_path: str) -> str:
    """Where the schedule figure goes next to ``plot_path`` (``x.png`` -> ``x_schedule.png``)."""
    p = Path(plot_path)
    return str(p.with_name(p.stem + "_schedule" + p.suffix))


def write_plots(result: Plan, cfg: RunConfig, png: str) -> None:
    """The ranking plot, and the schedule of the chosen layout (the overrides' own when valid, else the best)."""
    # matplotlib costs about a second to import: only ``--plot`` pays for it.
    from kilocard.planner.plots import plot_plan, plot_schedule

    with write_file(output_file("--plot", png), "--plot") as tmp:
        plot_plan(result, str(tmp))
    shown = result.recipe or (result.top[0] if result.top else None)
    if shown is not None:
        with write_file(output_file("--plot", schedule_path(png)), "--plot") as tmp:
            plot_schedule(shown.candidate, apply(cfg, shown.candidate), str(tmp))
    print(f"wrote {png}" + (f" and {schedule_path(png)}" if shown is not None else ""), file=sys.stderr)


def execute(args: argparse.Namespace) -> int:
    """Search, print the ranking, optionally plot."""
    if args.top < 1:
        return fail("plan", f"--top: {args.top} must be at least 1", exits.USAGE)
    if args.plot is not None:  # before the search: both files are ones kilocard may write
        output_file("--plot", args.plot)
        output_file("--plot", schedule_path(args.plot))
    if args.plot and not importable("matplotlib"):  # before the search: nothing computed for nothing
        return fail("plan", f"--plot {args.plot}: needs matplotlib ({install_hint('plots')})", exits.USAGE)
    cfg = to_run_config(compose(list(args.overrides)))
    site, problem = site_calibration(cfg)
    if problem is not None:
        return fail("plan", f"{problem.field}={problem.value}: {problem.message}", exits.USAGE)
    try:
        result = plan(cfg, top=args.top, site=site)
    except ValueError as e:
        return fail("plan", str(e), exits.USAGE)
    print(render_json(result) if args.format == "json" else render_text(result))
    if args.plot:
        write_plots(result, cfg, args.plot)
    return exits.OK if result.top else exits.INVALID


# --- what plan prints -----------------------------------------------------------------------------


def _row(i: object, r: Ranked) -> tuple[str, ...]:
    c = r.candidate
    gib = r.memory.get("total", 0) / 2**30
    return (
        str(i),
        str(c.tp),
        str(c.pp),
        str(c.vp or "-"),
        str(c.cp),
        str(c.ep),
        str(c.etp or c.tp),
        str(c.mbs),
        c.recompute,
        "yes" if c.distributed_optimizer else "no",
        f"{r.step_time_s:.3g}",
        _num(r.tflops_per_gpu),
        f"{r.mfu:.1%}",
        f"{gib:.3g}",
    )


def _num(x: float) -> str:
    """1234 -> '1234', 12.3 -> '12.3', 0.0123 -> '0.0123' (CPU ranks run at GFLOP/s)."""
    return f"{x:.0f}" if x >= 100 else f"{x:.3g}"


def render_text(p: Plan) -> str:
    """The table ``kilocard plan`` prints, each entry followed by the overrides that select it (only the
    fields that differ from the config)."""
    header = (
        "#",
        "TP",
        "PP",
        "VP",
        "CP",
        "EP",
        "ETP",
        "MBS",
        "recompute",
        "distopt",
        "step s",
        "TF/s/GPU",
        "MFU",
        "mem GiB",
    )
    entries = table_rows(p)
    rows = [header] + [_row(i, r) for i, r in entries]
    widths = [max(len(r[j]) for r in rows) for j in range(len(header))]
    out = [
        f"{p.world} x {p.gpu}: {p.candidates} candidates after divisibility filters, {p.validated} validated; "
        f"MFU against {_num(p.peak_flops / 1e12)} TFLOP/s dense peak, FLOPs convention {CONVENTION}"
    ]
    out.append("  ".join(v.rjust(w) for v, w in zip(header, widths, strict=False)))
    for (_, r), row in zip(entries, rows[1:], strict=True):
        out.append("  ".join(v.rjust(w) for v, w in zip(row, widths, strict=False)))
        out.append("    " + (" ".join(r.candidate.overrides(p.base)) or "(as configured: no override)"))
    if not p.top:
        out.append(no_layout_line(p))
    else:
        out.append("#1's step time: " + breakdown_line(p.top[0]))
    out.extend(model_error_lines(p.model_error, p.model_error_issue))
    if p.site_fit is not None:
        out.append(f"  predictions use the site refit; {p.site_fit.summary()}")
    out.append("")
    out.append(own_layout_line(p))
    return "\n".join(out)


def breakdown_line(r: Ranked) -> str:
    """Where a layout's predicted step time goes, largest share first."""
    shares = sorted(((v / r.step_time_s, k) for k, v in r.breakdown.items() if v > 0), reverse=True)
    return ", ".join(f"{k} {share:.0%}" for share, k in shares if share >= 0.005)


def no_layout_line(p: Plan) -> str:
    """Why the table is empty."""
    line = f"no layout the validator accepts among {p.candidates} candidates"
    if p.over_memory and p.min_memory_bytes and p.hbm_usable_bytes:
        gpus_needed = p.world * p.min_memory_bytes / p.hbm_usable_bytes
        line += (
            f": {p.over_memory} exceed the usable {p.hbm_usable_bytes / 2**30:.1f} GiB per GPU (the smallest "
            f"needs {p.min_memory_bytes / 2**30:.1f} GiB); try more GPUs (at least ~{gpus_needed:.0f}, "
            "cluster.nodes=...)"
        )
    return line


def own_layout_line(p: Plan) -> str:
    """One line on how the config's own layout (its TP, PP, CP, EP, ETP) ranks, naming its rows."""
    if p.recipe_layout_rank is None:
        if p.recipe_issue:
            return f"the config's own layout is not accepted: {p.recipe_issue}"
        why = " (validation budget exhausted)" if p.exhausted else ""
        return f"the config's own layout is not among the accepted layouts ranked{why}"
    best = p.top[0].tflops_per_gpu if p.top else 0.0
    own = p.recipe.tflops_per_gpu if p.recipe else 0.0
    gap = f", {1 - own / best:.1%} below the best" if best and own < best else ""
    labels = [label for label, _ in table_rows(p) if label.endswith(OWN_MARK)]
    fastest = p.recipe_layout_best
    tp, pp, cp, ep, etp = fastest.candidate.layout_key if fastest else (0,) * 5
    head = f"the config's own layout (TP {tp}, PP {pp}, CP {cp}, EP {ep}, ETP {etp}) ranks #{p.recipe_layout_rank}"
    unit = " TFLOP/s per GPU"
    if fastest is None or (p.recipe is not None and p.recipe.candidate == fastest.candidate):
        return f"{head} of the accepted layouts (row {labels[0]}: as configured, {_num(own)}{unit}{gap})"
    best_choice = _num(fastest.tflops_per_gpu)
    rows = f"row {labels[0]}: its fastest VP, micro-batch, recompute and optimizer, {best_choice}{unit}"
    if p.recipe is not None:
        second = f"row {labels[1]}: as configured, {_num(own)}{gap}"
    else:
        second = f"as configured: rejected, {p.recipe_issue}" if p.recipe_issue else "as configured: not evaluated"
    return f"{head} of the accepted layouts ({rows}; {second})"


def render_json(p: Plan) -> str:
    """``--format json``."""

    def one(r: Ranked) -> dict:
        return {
            **dataclasses.asdict(r.candidate),
            "overrides": r.candidate.overrides(p.base),
            "step_time_s": r.step_time_s,
            "tflops_per_gpu": r.tflops_per_gpu,
            "mfu": r.mfu,
            "memory_bytes": r.memory,
            "breakdown": r.breakdown,
        }

    return json.dumps(
        {
            "world": p.world,
            "gpu": p.gpu,
            "peak_flops": p.peak_flops,
            "convention": CONVENTION,
            "candidates": p.candidates,
            "validated": p.validated,
            "top": [one(r) for r in p.top],
            "recipe_layout_rank": p.recipe_layout_rank,
            "recipe": one(p.recipe) if p.recipe else None,
            "recipe_issue": p.recipe_issue,
            **model_error_json(p.model_error, p.model_error_issue),
            "site_fit": p.site_fit.to_json() if p.site_fit else None,
        },
        indent=1,
    )
