"""``kilocard validate``: compose, validate, print a layout summary, a memory table and every issue."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence

from kilocard.config.compose import compose_many, to_run_config
from kilocard.topology import GiB
from kilocard.validate import validate
from kilocard.validate.issues import ERROR, Report

EXIT_OK, EXIT_INVALID = 0, 1
MEMORY_ROWS = ("weights", "gradients", "optimizer", "activations", "total")


def _scope_text(g) -> str:
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
            f"predicted: {pred.step_time_s:.3g} s/step, {pred.tflops_per_gpu:.1f} TFLOP/s per GPU, "
            f"MFU {pred.mfu:.1%} ({pred.convention}, peak {pred.peak_flops / 1e12:.0f} "
            f"TFLOP/s {pred.peak_dtype})"
        )
    return out


def human_bytes(b: float) -> str:
    """Bytes as GiB, MiB or KiB, whichever reads best."""
    for unit, size in (("GiB", GiB), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= size / 10:
            return f"{b / size:.2f} {unit}"
    return f"{b:.0f} B"


def issue_lines(report: Report) -> list[str]:
    """Every issue: severity, code, field = value, message, and the fix."""
    if not report.issues:
        return ["no problems found"]
    out = []
    for i in report.issues:
        out.append(f"{i.severity.upper()} {i.code}: {i.field} = {i.value!r}: {i.message}")
        out.append(f"    fix: {i.hint}")
    n_err = sum(i.severity == ERROR for i in report.issues)
    out.append(f"{n_err} error(s), {len(report.issues) - n_err} warning(s)")
    return out


def render_text(report: Report) -> str:
    """The whole text report."""
    return "\n".join(layout_lines(report) + memory_lines(report) + issue_lines(report))


def validate_command(overrides: Sequence[str], multirun: bool = False, fmt: str = "text") -> int:
    """Compose each config, validate it, print; 0 when no errors, 1 when any config has one."""
    reports = []
    for combo, cfg in compose_many(overrides, multirun=multirun):
        reports.append((combo, validate(to_run_config(cfg))))
    if fmt == "json":
        if multirun:
            print(json.dumps([{"overrides": c, **r.to_dict()} for c, r in reports], indent=2))
        else:
            print(reports[0][1].to_json())
    else:
        for combo, r in reports:
            if multirun:
                print(f"# overrides: {' '.join(combo)}")
            print(render_text(r))
    sys.stdout.flush()
    return EXIT_OK if all(r.valid for _, r in reports) else EXIT_INVALID
