"""Figures of ``kilocard plan --plot``: ranked layouts with their memory, and a pipeline schedule.

Matplotlib with the Agg backend (no display needed). The schedule is simulated, not drawn from a
template: each pipeline rank runs Megatron-Core's order of forward and backward passes (1F1B, or
interleaved 1F1B with ``VP`` model chunks per rank), each pass starts when its rank is free and its
input has arrived, and the idle time left over is the bubble.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from kilocard.config.schema import RunConfig  # noqa: E402

MEMORY_PARTS = ("weights", "gradients", "optimizer", "activations")


def _label(c) -> str:
    parts = [f"TP{c.tp}", f"PP{c.pp}"]
    if c.vp:
        parts.append(f"VP{c.vp}")
    if c.cp > 1:
        parts.append(f"CP{c.cp}")
    if c.ep > 1:
        parts.append(f"EP{c.ep}")
    parts.append(f"mbs{c.mbs}")
    if c.recompute != "none":
        parts.append(c.recompute[:3])
    return " ".join(parts)


def plot_plan(plan, path: str) -> None:
    """Predicted MFU per ranked layout (top) and its memory per GPU by component (bottom)."""
    entries = list(plan.top)
    if plan.recipe is not None and all(r.candidate != plan.recipe.candidate for r in entries):
        entries.append(plan.recipe)
    labels = [_label(r.candidate) for r in entries]
    own = [plan.recipe is not None and r.candidate == plan.recipe.candidate for r in entries]
    x = list(range(len(entries)))
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(max(8, 0.9 * len(entries) + 3), 8), sharex=True)
    colors = ["tab:orange" if o else "tab:blue" for o in own]
    ax1.bar(x, [100 * r.mfu for r in entries], color=colors)
    ax1.set_ylabel("predicted MFU (%)")
    ax1.set_title(
        f"{plan.world} x {plan.gpu}: layouts by predicted throughput\n(orange: the config's own)", fontsize=10
    )
    bottom = [0.0] * len(entries)
    for part in MEMORY_PARTS:
        vals = [r.memory.get(part, 0) / 2**30 for r in entries]
        ax2.bar(x, vals, bottom=bottom, label=part)
        bottom = [b + v for b, v in zip(bottom, vals, strict=False)]
    if plan.hbm_usable_bytes:
        ax2.axhline(plan.hbm_usable_bytes / 2**30, color="black", linestyle="--", label="usable HBM")
    ax2.set_ylabel("memory per GPU (GiB)")
    ax2.legend(loc="upper right", fontsize=8)
    ax2.set_xticks(x)
    ax2.set_xticklabels(labels, rotation=35, ha="right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def schedule_path(plot_path: str) -> str:
    """Where the schedule figure goes next to ``plot_path`` (``x.png`` -> ``x_schedule.png``)."""
    p = Path(plot_path)
    return str(p.with_name(p.stem + "_schedule" + (p.suffix or ".png")))


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


def _dependency(op: Op, pp: int, vp: int):
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
    done: dict[tuple, float] = {}
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


def plot_schedule(candidate, cfg: RunConfig, path: str, max_micro: int = 0) -> float:
    """Draw the pipeline schedule of ``candidate``; return the bubble fraction of the drawn part."""
    pp, vp = candidate.pp, candidate.vp or 1
    dp = (cfg.cluster.nodes * cfg.cluster.gpus_per_node) // (candidate.tp * candidate.pp * candidate.cp)
    micro_total = max(1, cfg.trainer.global_batch_size // (candidate.mbs * dp))
    cap = max_micro or max(2 * pp, pp)
    micro = min(micro_total, cap)
    if vp > 1:
        micro = max(pp, micro - micro % pp)
    t_bwd = 3.0 if candidate.recompute == "full" else 2.0
    times = simulate(pp, vp, micro, 1.0 / vp, t_bwd / vp)
    span = max(e for _, e in times.values())
    busy = sum(e - s for s, e in times.values())
    bubble = 1.0 - busy / (span * pp)
    fig, ax = plt.subplots(figsize=(12, 0.45 * pp + 1.8))
    cmap = plt.get_cmap("tab20")
    for op, (s, e) in times.items():
        color = cmap((op.micro % 10) * 2 + (0 if op.kind == "F" else 1))
        ax.barh(op.rank, e - s, left=s, height=0.8, color=color, edgecolor="black", linewidth=0.3)
        if e - s > span / 120:
            ax.text(
                (s + e) / 2,
                op.rank,
                f"{op.kind}{op.micro}" + (f".{op.chunk}" if vp > 1 else ""),
                ha="center",
                va="center",
                fontsize=5,
            )
    ax.set_yticks(range(pp))
    ax.set_yticklabels([f"stage {r}" for r in range(pp)], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("time (forward pass of one micro-batch through one stage = 1)")
    kind = f"interleaved 1F1B, VP={vp}" if vp > 1 else "1F1B"
    shown = "" if micro == micro_total else f" (first {micro} of {micro_total} micro-batches)"
    ax.set_title(
        f"{kind}, PP={pp}, {micro} micro-batches{shown}\nidle (white) {bubble:.1%} of rank time; "
        f"(P-1)/(V*M) = {(pp - 1) / (vp * micro):.1%} of the ideal",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return bubble
