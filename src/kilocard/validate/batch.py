"""Rules on batch and sequence: global batch vs micro-batch * DP, interleaving, CP/SP sequence splits."""

from __future__ import annotations

from collections.abc import Iterable

from kilocard.config.schema import RunConfig
from kilocard.layout import Layout
from kilocard.validate.issues import Issue, error, warning

T = "trainer."


def rule_global_batch(cfg: RunConfig, lay: Layout) -> Iterable[Issue]:
    """The global batch is a whole number of micro-batches on every DP rank."""
    t = cfg.trainer
    if lay.dp is None or t.micro_batch_size < 1 or t.global_batch_size < 1:
        return
    per = t.micro_batch_size * lay.dp
    if t.global_batch_size % per:
        lo = max(per, t.global_batch_size // per * per)
        yield error(
            "GLOBAL_BATCH",
            T + "global_batch_size",
            t.global_batch_size,
            f"global_batch_size({t.global_batch_size}) is not divisible by "
            f"micro_batch_size({t.micro_batch_size}) * dp({lay.dp}) = {per}",
            f"set {T}global_batch_size={lo} or {lo + per}",
        )


def rule_interleaved_microbatches(cfg: RunConfig, lay: Layout) -> Iterable[Issue]:
    """Interleaved 1F1B needs num_microbatches % pp == 0 (Megatron-Core's schedule)."""
    vp, m, dp = cfg.parallel.virtual_pipeline_model_parallel_size, lay.num_microbatches, lay.dp
    if vp is None or lay.pp == 1 or m is None or dp is None:
        return
    if m % lay.pp:
        yield error(
            "INTERLEAVED_MICROBATCHES",
            T + "global_batch_size",
            cfg.trainer.global_batch_size,
            f"interleaved schedule: num_microbatches = global_batch_size({cfg.trainer.global_batch_size}) / "
            f"(micro_batch_size({cfg.trainer.micro_batch_size}) * dp({dp})) = {m} is not a multiple of "
            f"pp({lay.pp})",
            f"make the micro-batch count a multiple of {lay.pp}, e.g. {T}global_batch_size="
            f"{(m // lay.pp + 1) * lay.pp * cfg.trainer.micro_batch_size * dp}",
        )


def rule_pipeline_bubble(cfg: RunConfig, lay: Layout) -> Iterable[Issue]:
    """Fewer micro-batches than stages leaves most of the pipeline idle (warning)."""
    m = lay.num_microbatches
    if lay.pp > 1 and m is not None and m < lay.pp:
        yield warning(
            "PIPELINE_BUBBLE",
            T + "global_batch_size",
            cfg.trainer.global_batch_size,
            f"num_microbatches({m}) < pp({lay.pp}): the pipeline never fills",
            f"raise {T}global_batch_size or lower {T}micro_batch_size",
        )


def rule_sequence_split(cfg: RunConfig, lay: Layout) -> Iterable[Issue]:
    """CP > 1 needs seq % (2*cp) == 0; SP needs the per-CP-rank sequence divisible by TP."""
    s = cfg.model.seq_length
    if s < 1:
        return
    if lay.cp > 1 and s % (2 * lay.cp):
        yield error(
            "SEQ_CP",
            "model.seq_length",
            s,
            f"seq_length({s}) is not divisible by 2 * cp({lay.cp}) = {2 * lay.cp}",
            f"use a seq_length that is a multiple of {2 * lay.cp}",
        )
    elif cfg.parallel.sequence_parallel and lay.tp > 1 and (s // lay.cp) % lay.tp:
        yield error(
            "SEQ_TP_SP",
            "model.seq_length",
            s,
            f"sequence parallel: seq_length({s}) / cp({lay.cp}) = {s // lay.cp} is not divisible by tp({lay.tp})",
            f"use a seq_length that is a multiple of {lay.tp * lay.cp * (2 if lay.cp > 1 else 1)}",
        )


def rule_max_positions(cfg: RunConfig, lay: Layout) -> Iterable[Issue]:
    """max_position_embeddings >= seq_length."""
    m = cfg.model
    if m.max_position_embeddings < m.seq_length:
        yield error(
            "MAX_POSITIONS",
            "model.max_position_embeddings",
            m.max_position_embeddings,
            f"max_position_embeddings({m.max_position_embeddings}) < seq_length({m.seq_length})",
            f"set model.max_position_embeddings={m.seq_length}",
        )


RULES = (
    rule_global_batch,
    rule_interleaved_microbatches,
    rule_pipeline_bubble,
    rule_sequence_split,
    rule_max_positions,
)
