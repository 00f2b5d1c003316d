"""``kilocard validate``: compose, validate, print a layout summary, a memory table and every issue.

Exit 0 when no config has an error (warnings allowed), 1 when any has one, 2 when a config cannot
be composed. ``--format json`` prints ``Report.to_json()`` (a list with ``--multirun``).
"""

from __future__ import annotations

import argparse
import json

from omegaconf import DictConfig

from kilocard.calibration.trust import model_error, model_error_json, model_error_lines, unscored_baseline
from kilocard.commands import exits
from kilocard.commands.common import add_config_args, add_path_check_arg, check_config, site_calibration
from kilocard.commands.output import count_line, issue_line
from kilocard.config.compose import compose_many
from kilocard.config.schema import RunConfig
from kilocard.launch.refusals import Target, validate_issues
from kilocard.topology import GiB, GroupPlacement
from kilocard.validate.issues import Report

HELP = "check layout, batch, precision, topology and memory"
#: Shown under ``kilocard validate --help`` (each parsed by tests/commands/test_cli_help.py).
EXAMPLES = (
    "kilocard validate recipe=llama3_70b cluster=h100_dgx cluster.nodes=8",
    "kilocard validate recipe=tiny_gpt --format json",
)
MEMORY_ROWS = ("weights", "gradients", "optimizer", "activations", "total")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Overrides, ``-m``, ``--format``."""
    add_config_args(p)
    add_path_check_arg(p)
    p.add_argument(
        "--format", choices=("text", "json"), default="text", help="the report as text or as one JSON document"
    )


def _scope_text(g: GroupPlacement) -> str:
    if g.size <= 1:
        return "single rank"
    return {
        "nvlink": "inside one NVLink domain" + ("" if g.within_node else " (spans nodes)"),
        "node": "inside one node (across NVLink domains)",
        "network": "crosses the network",
    }[g.scope]


def layout_lines(report: Report) -> list[str]:
    """The layout summary: sizes, micro-batches and where each group sits."""
    lay = report.layout
    out = [
        f"layout: world {lay.world_size} = {lay.nodes} nodes x {lay.gpus_per_node} GPUs "
        f"(NVLink domain {lay.nvlink_domain_size})",
        f"  tp {lay.tp}  cp {lay.cp}  ep {lay.ep}  etp {lay.etp}  pp {lay.pp}  vp {lay.vp or '-'}  "
        f"dp {lay.dp if lay.dp is not None else '?'}  expert-dp {lay.expert_dp if lay.expert_dp is not None else '?'}",
        f"  micro-batches per step: {lay.num_microbatches if lay.num_microbatches is not None else '?'}"
        + (f"   layers per stage: {_stages(lay.stage_layers)}" if lay.stage_layers else ""),
    ]
    for name in ("tp", "cp", "tp_cp", "ep", "dp", "pp"):
        g = lay.groups.get(name)
        if g is not None and g.size > 1:
            out.append(f"  {name:<6} group of {g.size:>6}: {_scope_text(g)}")
    return out


def _stages(st: list[int]) -> str:
    if len(set(st)) == 1:
        return f"{st[0]} x {len(st)}"
    return " ".join(str(x) for x in st) if len(st) <= 16 else f"first {st[0]}, middle {st[1]}, last {st[-1]}"


def memory_lines(report: Report) -> list[str]:
    """The per-GPU memory table against HBM."""
    est = report.estimates
    hbm, usable = est.hbm_bytes, est.hbm_usable_bytes
    if est.memory is None:
        return ["memory per GPU: not estimated (invalid model shape)"]
    mem = est.memory.to_json()
    out = ["memory per GPU (most loaded pipeline stage):"]
    for row in MEMORY_ROWS:
        share = f"{100 * mem[row] / hbm:5.1f}% of HBM" if hbm else ""
        out.append(f"  {row:<12}{human_bytes(mem[row]):>12}  {share}")
    if hbm and usable is not None:
        out.append(f"  {'HBM':<12}{human_bytes(hbm):>12}  (usable after reserve: {human_bytes(usable)})")
    if est.flops_per_iteration is not None:
        out.append(f"FLOPs per iteration: {est.flops_per_iteration:.4g} ({est.flops_convention})")
    pred = est.prediction
    if pred is not None:
        out.append(
            f"predicted: {pred.step_time_s:.3g} s/step, {pred.tflops_per_gpu:.4g} TFLOP/s per GPU, "
            f"MFU {pred.mfu:.1%} ({pred.convention}, peak {pred.peak_flops / 1e12:.4g} "
            f"TFLOP/s {pred.peak_dtype})"
        )
        if pred.eval_interval:
            out.append(
                f"predicted evaluation: {pred.eval_time_s:.3g} s every {pred.eval_interval} steps "
                f"({pred.eval_s_per_step:.3g} s/step, forward-only micro-batches)"
            )
    return out


def human_bytes(b: float) -> str:
    """Bytes as GiB, MiB or KiB, whichever reads best."""
    for unit, size in (("GiB", GiB), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= size / 10:
            return f"{b / size:.2f} {unit}"
    return f"{b:.0f} B"


def issue_lines(report: Report) -> list[str]:
    """Every issue (the shared one-line form), then the count; or ``no problems found``."""
    if not report.issues:
        return ["no problems found"]
    return [issue_line(i) for i in report.issues] + [count_line(report.issues)]


def model_error_line(cfg: RunConfig, report: Report) -> list[str]:
    """Under a prediction, how far to trust it: the model's held-out error on published rows like ``cfg``
    (and with ``perf.site_baselines``, the site rows' leave-one-out error of the refit it used)."""
    if report.estimates.prediction is None:
        return []
    site, _ = site_calibration(cfg)
    extra = [f"  predictions use the site refit; {site.summary()}"] if site else []
    unscored = unscored_baseline(cfg)
    extra += [f"  {unscored}"] if unscored else []
    return model_error_lines(*model_error(cfg), indent="  ") + extra


def render_text(report: Report, cfg: RunConfig | None = None) -> str:
    """The whole text report (with ``cfg``: the model's error under the prediction)."""
    band = model_error_line(cfg, report) if cfg is not None else []
    return "\n".join(layout_lines(report) + memory_lines(report) + band + issue_lines(report))


def report_dict(cfg: RunConfig, report: Report) -> dict:
    """``Report.to_dict`` with the model's error beside the prediction (``estimates.model_error`` and
    ``estimates.model_error_issue``, as in ``kilocard plan``)."""
    d = report.to_dict()
    if report.estimates.prediction is not None:
        d["estimates"].update(model_error_json(*model_error(cfg)))
        site, _ = site_calibration(cfg)
        d["estimates"]["site_fit"] = site.to_json() if site else None
        d["estimates"]["baseline_unscored"] = unscored_baseline(cfg)
    return d


def checked(cfg: DictConfig, skip_paths: bool) -> tuple[RunConfig, Report]:
    """``check_config`` plus every check the verb that launches the config makes before launching it
    (``kilocard.launch.refusals``): validate reports what ``run`` or ``sbatch`` would refuse."""
    run_cfg, report = check_config(cfg, skip_paths)
    report.issues[:] = validate_issues(Target(cfg, run_cfg), report.issues)
    return run_cfg, report


def execute(args: argparse.Namespace) -> int:
    """Compose each config, validate it, print; 0 when no errors, 1 when any config has one."""
    reports = [
        (combo, *checked(cfg, args.skip_path_checks)) for combo, cfg in compose_many(args.overrides, args.multirun)
    ]
    if args.format == "json":
        if args.multirun:
            print(json.dumps([{"overrides": c, **report_dict(cfg, r)} for c, cfg, r in reports], indent=2))
        else:
            print(json.dumps(report_dict(reports[0][1], reports[0][2]), indent=2))
    else:
        for combo, cfg, r in reports:
            if args.multirun:
                print(f"# overrides: {' '.join(combo)}")
            print(render_text(r, cfg))
    return exits.OK if all(r.valid for _, _, r in reports) else exits.INVALID
