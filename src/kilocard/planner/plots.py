"""Figures of ``kilocard plan --plot``: ranked layouts with their memory, and a pipeline schedule.

Matplotlib with the Agg backend (no display needed). The schedule is simulated, not drawn from a
template: each pipeline rank runs Megatron-Core's order of forward and backward passes (1F1B, or
interleaved 1F1B with ``VP`` model chunks per rank), each pass starts when its rank is free and its
input has arrived, and the idle time left over is the bubble.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

from kilocard.config.schema import RunConfig  # noqa: E402
from kilocard.layout import data_parallel_size, world_size  # noqa: E402
from kilocard.planner.search import OWN_MARK, Candidate, Plan, Ranked, table_rows  # noqa: E402

MEMORY_PARTS = ("weights", "gradients", "optimizer", "activations")
MEMORY_COLORS = {"weights": "#7f7f7f", "gradients": "#bcbd22", "optimizer": "#17becf", "activations": "#9467bd"}
"""Memory parts: colours the MFU panel above does not use, so no colour means two things."""
OWN_COLOR, OTHER_COLOR = "tab:orange", "tab:blue"
KIND_COLORS = {"F": "#4c8bd6", "B": "#e8913a", "FB": "#b48ac9"}
"""Forward, backward, and (dense schedules) a block of alternating forward and backward passes."""
KIND_NAMES = {"F": "forward", "B": "backward", "FB": "forward/backward alternating (1F1B)"}
DPI = 100
TOTAL_BOX = {"facecolor": "white", "edgecolor": "none", "pad": 1.0}
"""Behind each memory total, so the usable-HBM line never crosses its digits."""


def _label(key: str, c: Candidate) -> str:
    """Two short lines under a bar: the table's ``#`` and the layout (recompute and micro-batch below)."""
    head = [f"TP{c.tp}", f"PP{c.pp}"] + ([f"VP{c.vp}"] if c.vp else [])
    head += [f"CP{c.cp}"] * (c.cp > 1) + [f"EP{c.ep}"] * (c.ep > 1)
    tail = [f"mbs{c.mbs}"] + ([c.recompute] if c.recompute != "none" else [])
    return f"#{key}\n{' '.join(head)}\n{' '.join(tail)}"


def plot_plan(plan: Plan, path: str) -> None:
    """Predicted MFU per table row (top, zoomed) and its memory per GPU by component (bottom), the
    bars named as the rows of ``kilocard plan``'s table (``*``: the config's own layout)."""
    entries = table_rows(plan)
    x = list(range(len(entries)))
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(max(9.0, 1.15 * len(entries) + 3), 9), sharex=True)
    mfu_panel(ax1, plan, entries)
    memory_panel(ax2, plan, entries)
    ax2.set_xticks(x)
    ax2.set_xticklabels([_label(k, r.candidate) for k, r in entries], fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI, bbox_inches="tight")
    plt.close(fig)


def mfu_panel(ax: Axes, plan: Plan, entries: list[tuple[str, Ranked]]) -> None:
    """MFU bars with their values; the axis spans the values (not from zero) so differences show."""
    mfu = [100 * r.mfu for _, r in entries]
    colors = [OWN_COLOR if k.endswith(OWN_MARK) else OTHER_COLOR for k, _ in entries]
    bars = ax.bar(range(len(entries)), mfu, color=colors)
    ax.bar_label(bars, labels=[f"{v:.1f}%" for v in mfu], fontsize=8, padding=2)
    lo, hi = min(mfu), max(mfu)
    pad = max(0.15 * (hi - lo), 0.02 * hi, 0.1)
    ax.set_ylim(max(0.0, lo - 2 * pad), hi + 1.5 * pad)
    ax.set_ylabel("predicted MFU (%)\naxis zoomed, not from 0")
    ax.set_title(
        f"{plan.world} x {plan.gpu}: layouts by predicted throughput (bars named as the plan table's rows; "
        f"orange, *: the config's own)",
        fontsize=10,
    )


def memory_panel(ax: Axes, plan: Plan, entries: list[tuple[str, Ranked]]) -> None:
    """Stacked memory per GPU with each part's GiB inside its segment (when tall enough) and the total
    above; the legend sits outside the axes, right of them."""
    x = range(len(entries))
    totals = [sum(r.memory.get(p, 0) for p in MEMORY_PARTS) / 2**30 for _, r in entries]
    top = max([*totals, (plan.hbm_usable_bytes or 0) / 2**30])
    bottom = [0.0] * len(entries)
    for part in MEMORY_PARTS:
        vals = [r.memory.get(part, 0) / 2**30 for _, r in entries]
        bars = ax.bar(x, vals, bottom=bottom, label=part, color=MEMORY_COLORS[part])
        ax.bar_label(bars, labels=[f"{v:.1f}" if v > 0.06 * top else "" for v in vals], label_type="center", fontsize=7)
        bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
    for i, t in enumerate(totals):
        ax.text(i, t, f"{t:.1f}", ha="center", va="bottom", fontsize=8, fontweight="bold", bbox=TOTAL_BOX)
    if plan.hbm_usable_bytes:
        ax.axhline(plan.hbm_usable_bytes / 2**30, color="black", linestyle="--", label="usable HBM")
    ax.set_ylim(0, top * 1.12)
    ax.set_ylabel("memory per GPU (GiB)")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)


@dataclass(frozen=True)
class Op:
    """One forward or backward pass of one micro-batch through one model chunk on one rank."""

    rank: int
    """Pipeline rank."""
    kind: str
    """``F`` or ``B``."""
    chunk: int
    """Model chunk (virtual stage index on this rank)."""
    micro: int
    """Micro-batch."""


def rank_order(rank: int, pp: int, vp: int, micro: int) -> list[Op]:
    """Megatron-Core's pass order on ``rank`` (``forward_backward_pipelining_*``)."""
    total = micro * vp
    if vp == 1:
        warmup = min(pp - rank - 1, micro)
    else:
        warmup = min((pp - rank - 1) * 2 + (vp - 1) * pp, total)

    def fwd(k: int) -> Op:
        group, pos = divmod(k, pp * vp)
        return Op(rank, "F", (pos // pp) % vp, group * pp + pos % pp)

    def bwd(k: int) -> Op:
        group, pos = divmod(k, pp * vp)
        return Op(rank, "B", vp - 1 - (pos // pp) % vp, group * pp + pos % pp)

    order = [fwd(k) for k in range(warmup)]
    f, b = warmup, 0
    while f < total:
        order += [fwd(f), bwd(b)]
        f, b = f + 1, b + 1
    order += [bwd(k) for k in range(b, total)]
    return order


def _dependency(op: Op, pp: int, vp: int) -> tuple[str, int, int, int] | None:
    """The pass ``op`` waits for, as ``(kind, rank, chunk, micro)``; None for the first stage's first chunk."""
    if op.kind == "F":
        if op.rank > 0:
            return ("F", op.rank - 1, op.chunk, op.micro)
        return ("F", pp - 1, op.chunk - 1, op.micro) if op.chunk > 0 else None
    if op.rank < pp - 1:
        return ("B", op.rank + 1, op.chunk, op.micro)
    return ("B", 0, op.chunk + 1, op.micro) if op.chunk < vp - 1 else ("F", op.rank, op.chunk, op.micro)


def simulate(pp: int, vp: int, micro: int, t_fwd: float, t_bwd: float) -> dict[Op, tuple[float, float]]:
    """Start and end time of every pass (``t_fwd``/``t_bwd``: one chunk, one micro-batch)."""
    orders = [rank_order(r, pp, vp, micro) for r in range(pp)]
    pos = [0] * pp
    free = [0.0] * pp
    done: dict[tuple[str, int, int, int], float] = {}
    times: dict[Op, tuple[float, float]] = {}
    remaining = sum(len(o) for o in orders)
    while remaining:
        progressed = False
        for r in range(pp):
            while pos[r] < len(orders[r]):
                op = orders[r][pos[r]]
                dep = _dependency(op, pp, vp)
                if dep is not None and dep not in done:
                    break
                start = max(free[r], done.get(dep, 0.0) if dep else 0.0)
                end = start + (t_fwd if op.kind == "F" else t_bwd)
                times[op] = (start, end)
                done[("F" if op.kind == "F" else "B", r, op.chunk, op.micro)] = end
                free[r] = end
                pos[r] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            raise RuntimeError(f"pipeline schedule deadlocked (pp={pp}, vp={vp}, micro={micro})")
    return times


MIN_LABEL_PX = 14
"""Narrowest pass (pixels) that gets its own box and label; denser schedules are drawn as runs."""


def plot_schedule(candidate: Candidate, cfg: RunConfig, path: str, max_micro: int = 0) -> float:
    """Draw the pipeline schedule of ``candidate``; return the bubble fraction of the drawn part.

    Forward and backward passes have one colour each (legend); when a pass would be narrower than
    ``MIN_LABEL_PX``, consecutive passes of one kind on a rank are drawn as one run, labelled with
    how many passes it holds."""
    pp, vp = candidate.pp, candidate.vp or 1
    dp = data_parallel_size(world_size(cfg.cluster), candidate.tp, candidate.pp, candidate.cp) or 1
    micro_total = max(1, cfg.trainer.global_batch_size // (candidate.mbs * dp))
    micro = min(micro_total, max_micro or max(2 * pp, 16))
    if vp > 1:
        micro = max(pp, micro - micro % pp)
    t_bwd = 3.0 if candidate.recompute == "full" else 2.0
    times = simulate(pp, vp, micro, 1.0 / vp, t_bwd / vp)
    span = max(e for _, e in times.values())
    bubble = 1.0 - sum(e - s for s, e in times.values()) / (span * pp)
    width_in = 13.0
    fig, ax = plt.subplots(figsize=(width_in, 0.5 * pp + 2.0))
    px = width_in * DPI * 0.85 / span  # pixels per time unit, about
    dense = (1.0 / vp) * px < MIN_LABEL_PX
    for rank, kind, s, e, ops in _runs(times, merge=MIN_LABEL_PX / px if dense else 0.0):
        ax.barh(rank, e - s, left=s, height=0.8, color=KIND_COLORS[kind], edgecolor="black", linewidth=0.4)
        text = (
            _pass_label(kind, ops, vp) if not dense else (f"{kind}x{len(ops)}" if kind != "FB" else f"1F1B x{len(ops)}")
        )
        if (e - s) * px >= 6 * len(text):
            ax.text((s + e) / 2, rank, text, ha="center", va="center", fontsize=7)
    ax.set_yticks(range(pp))
    ax.set_yticklabels([f"stage {r}" for r in range(pp)], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, span)
    ax.set_xlabel("time (forward pass of one micro-batch through one stage = 1)")
    legend = [Patch(color=KIND_COLORS[k], label=name) for k, name in KIND_NAMES.items() if dense or k != "FB"]
    legend.append(Patch(facecolor="white", edgecolor="black", label="idle (bubble)"))
    ax.legend(handles=legend, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    kind = f"interleaved 1F1B, VP={vp}" if vp > 1 else "1F1B"
    shown = "" if micro == micro_total else f" (the first {micro} of {micro_total})"
    how = (
        "\nback-to-back passes drawn as one block: Fxn n forward, Bxn n backward, 1F1B xn alternating" if dense else ""
    )
    ax.set_title(
        f"{kind}, PP={pp}, {micro} micro-batches{shown}{how}\nidle {bubble:.1%} of rank time; "
        f"(P-1)/(V*M) = {(pp - 1) / (vp * micro):.1%} of the ideal",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=DPI, bbox_inches="tight")
    plt.close(fig)
    return bubble


def _pass_label(kind: str, ops: list[Op], vp: int) -> str:
    """``F3`` (forward of micro-batch 3), ``B3.1`` (backward, model chunk 1) for one pass."""
    return f"{kind}{ops[0].micro}" + (f".{ops[0].chunk}" if vp > 1 else "")


def _block_label(kind: str, ops: list[Op]) -> str:
    """``Fx12`` (12 forward passes back to back), ``1F1B x40`` (40 alternating passes)."""
    return f"1F1B x{len(ops)}" if kind == "FB" else f"{kind}x{len(ops)}"


def _runs(times: dict[Op, tuple[float, float]], merge: float) -> Iterator[tuple[int, str, float, float, list[Op]]]:
    """(rank, kind, start, end, passes) per drawn box: each pass; or, with ``merge`` (the narrowest
    width drawn alone), each back-to-back run of one kind (``F``/``B``), and back-to-back runs that
    are single passes or narrower than ``merge`` together as one alternating block (``FB``, the
    steady 1F1B phase)."""
    by_rank: dict[int, list[tuple[float, float, Op]]] = {}
    for op, (s, e) in times.items():
        by_rank.setdefault(op.rank, []).append((s, e, op))
    for rank, ops in sorted(by_rank.items()):
        ordered = sorted(ops, key=lambda t: t[0])
        if not merge:
            yield from ((rank, op.kind, s, e, [op]) for s, e, op in ordered)
            continue
        blocks: list[tuple[str, float, float, list[Op]]] = []
        for kind, s, e, run in _kind_runs(ordered):
            short = e - s < merge or len(run) == 1
            last = blocks[-1] if blocks else None
            if short and last and abs(last[2] - s) < 1e-9 and (last[0] == "FB" or _short(last, merge)):
                blocks[-1] = ("FB", last[1], e, last[3] + run)
            else:
                blocks.append((kind, s, e, run))
        yield from ((rank, kind, s, e, run) for kind, s, e, run in blocks)


def _short(block: tuple[str, float, float, list[Op]], merge: float) -> bool:
    return block[2] - block[1] < merge or len(block[3]) == 1


def _kind_runs(ordered: list[tuple[float, float, Op]]) -> Iterator[tuple[str, float, float, list[Op]]]:
    """(kind, start, end, passes) of each back-to-back run of passes of one kind on one rank."""
    run: list[tuple[float, float, Op]] = []
    for s, e, op in ordered:
        if run and (op.kind != run[-1][2].kind or s > run[-1][1] + 1e-9):
            yield run[0][2].kind, run[0][0], run[-1][1], [o for _, _, o in run]
            run = []
        run.append((s, e, op))
    if run:
        yield run[0][2].kind, run[0][0], run[-1][1], [o for _, _, o in run]
