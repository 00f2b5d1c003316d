"""Rules on the dataset fields the ranks build Megatron-Core's dataset from (``kilocard.data.datasets``).

Without them a bad ``data.type`` is refused only on the ranks, after the run directory
is written and the job waited in the queue. The input files themselves are checked by
``kilocard.validate.inputpaths`` (they need the filesystem).
"""

from __future__ import annotations

from collections.abc import Iterable

from kilocard.config.schema import RunConfig
from kilocard.layout import Layout
from kilocard.topology import gpu_spec
from kilocard.validate.issues import Issue, error, warning


def rule_sft_data(cfg: RunConfig, lay: Layout) -> Iterable[Issue]:
    """``SFT_LOSS_MASK``: ``data.sft`` needs indexed conversations (each prefix's mask is checked with the files)."""
    if cfg.data.sft and cfg.data.type != "indexed":
        yield error(
            "SFT_LOSS_MASK",
            "data.sft",
            True,
            f"data.sft=true needs conversations with their loss mask, but data.type is {cfg.data.type!r}",
            "data=tiny_chat, or your `kilocard preprocess --chat` output in data.data_path (data.type=indexed)",
        )


def rule_packing(cfg: RunConfig, lay: Layout) -> Iterable[Issue]:
    """``DATA_PACKING``: one conversation per sequence (``data.packing=false``) needs ``data.sft``; ``PACKING_RESET``:
    ``data.reset_attention_mask`` needs ``data.reset_position_ids`` (a conversation cut off from those before it
    starts at position 0; the THD layout on Transformer Engine finds the boundaries where the positions restart)."""
    d = cfg.data
    if not d.packing and not d.sft:
        yield error(
            "DATA_PACKING",
            "data.packing",
            False,
            "data.packing=false puts one conversation per sequence, which needs conversations (data.sft=true)",
            "data.packing=true, or data.sft=true with `kilocard preprocess --chat` data",
        )
    if d.reset_attention_mask and not d.reset_position_ids:
        yield error(
            "PACKING_RESET",
            "data.reset_position_ids",
            False,
            "data.reset_attention_mask=true keeps attention inside each document, but their positions run on "
            "(data.reset_position_ids=false)",
            "data.reset_position_ids=true",
        )


def rule_sft_packed_attention(cfg: RunConfig, lay: Layout) -> Iterable[Issue]:
    """``SFT_PACKED_ATTENTION`` (a warning): packed conversations without ``data.reset_attention_mask`` see the
    conversations before them in their sequence."""
    d = cfg.data
    if d.sft and d.packing and not d.reset_attention_mask:
        yield warning(
            "SFT_PACKED_ATTENTION",
            "data.reset_attention_mask",
            False,
            "data.sft packs several conversations per sequence, and each attends to the ones before it "
            "(data.reset_attention_mask=false): the loss of a conversation depends on its neighbours",
            "data.reset_attention_mask=true data.reset_position_ids=true, or data.packing=false",
        )


def rule_packing_thd(cfg: RunConfig, lay: Layout) -> Iterable[Issue]:
    """``PACKING_THD``: on NVIDIA GPUs (Transformer Engine's attention) ``data.reset_attention_mask`` packs in the
    THD layout, which takes one sequence per micro-batch and no context parallelism (the ranks refuse the rest,
    ``kilocard.train.megatron_adapter.check_packed_thd``; Megatron-Core's local attention on CPU ranks takes the
    mask at any batch size)."""
    gpu = gpu_spec(cfg.cluster.gpu)
    if not cfg.data.reset_attention_mask or gpu is None or gpu.vendor != "nvidia":
        return
    t, p = cfg.trainer, cfg.parallel
    if t.micro_batch_size != 1:
        yield error(
            "PACKING_THD",
            "trainer.micro_batch_size",
            t.micro_batch_size,
            f"data.reset_attention_mask packs conversations in the THD layout on {cfg.cluster.gpu} (Transformer "
            f"Engine), one sequence per micro-batch, but trainer.micro_batch_size={t.micro_batch_size}",
            "trainer.micro_batch_size=1 (a longer model.seq_length packs more conversations per sequence)",
        )
    if p.context_parallel_size > 1:
        yield error(
            "PACKING_THD",
            "parallel.context_parallel_size",
            p.context_parallel_size,
            f"data.reset_attention_mask (THD packing) with parallel.context_parallel_size={p.context_parallel_size} "
            f"is not built by kilocard",
            "parallel.context_parallel_size=1, or data.reset_attention_mask=false",
        )


RULES = (rule_sft_data, rule_packing, rule_sft_packed_attention, rule_packing_thd)
"""``data.split`` is ``kilocard.validate.evaluation``'s (its arithmetic is Megatron-Core's)."""
