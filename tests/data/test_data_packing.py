"""``data.packing`` with ``data.reset_position_ids``/``data.reset_attention_mask``, and ``data.packing=false``.

Samples of the shipped tiny chat set (``data/tiny_chat``) through Megatron-Core's ``GPTDataset`` switches:
position ids restart after every end-of-document token, the attention mask is block-diagonal causal (no
token sees another conversation), a sample that begins inside a conversation carries no loss on that piece;
unpacked samples are one conversation each, padded without loss. The THD layout's ``cu_seqlens`` (what
Transformer Engine's attention reads; no Transformer Engine here, so only the numbers are checked) follow the
same boundaries. The model-level proof (packed and unpacked give the same loss per token, and a conversation's
tokens do not change another's) is tests/data/test_packing_loss.py.
"""

from __future__ import annotations

import pytest
import torch

from kilocard.data.datasets import build_split_dataset, gpt_dataset_config
from kilocard.data.errors import DataError
from kilocard.data.split import TRAIN
from kilocard.data.tokenizer import get_tokenizer
from run_configs import cfg_of

pytestmark = [pytest.mark.integration, pytest.mark.mcore_range]  # Megatron-Core datasets; their API changes at 0.19

SEQ = 256
EOD = 0  # the tiny chat tokenizer's <|endoftext|>


def chat_dataset(tmp_path, packing: bool = True, reset: bool = True, samples: int = 16, mask: bool = True):
    """The train split of the tiny chat set as the trainer builds it (``mask``: the dataset's attention mask)."""
    cfg = cfg_of(
        {
            "data.type": "indexed",
            "data.data_path": ["data/tiny_chat/tiny_chat_text_document"],
            "data.tokenizer": "data/tiny_chat",
            "data.sft": True,
            "data.packing": packing,
            "data.reset_position_ids": reset,
            "data.reset_attention_mask": reset,
            "model.vocab_size": 320,
            "model.seq_length": SEQ,
        }
    )
    config = gpt_dataset_config(cfg, get_tokenizer(cfg.data.tokenizer), str(tmp_path / "cache"), mask)
    return build_split_dataset(config, TRAIN, samples, True, packing)


def segments(tokens: torch.Tensor) -> torch.Tensor:
    """Per position, the index of the conversation it belongs to (an EOD closes its conversation)."""
    ends = (tokens == EOD).long()
    return torch.cumsum(ends, 0) - ends


def test_positions_restart_and_attention_stays_inside_each_conversation(tmp_path) -> None:
    dataset = chat_dataset(tmp_path)
    crossings = 0
    for k in range(8):
        s = dataset[k]
        seg = segments(s["tokens"])
        assert int(seg[-1]) >= 1, "a 256-token sample holds several ~100-token conversations"
        starts = torch.cat([torch.tensor([True]), seg[1:] != seg[:-1]])
        expected = torch.zeros(SEQ, dtype=torch.long)
        for j in range(1, SEQ):
            expected[j] = 0 if starts[j] else expected[j - 1] + 1
        assert torch.equal(s["position_ids"], expected)
        allowed = (seg[:, None] == seg[None, :]) & torch.ones(SEQ, SEQ).tril().bool()
        assert torch.equal(~s["attention_mask"][0], allowed)  # True = masked, Megatron's convention
        crossings += int((seg[:, None] != seg[None, :]).tril().sum())
    assert crossings > 0


def test_without_the_switches_the_sequence_runs_on(tmp_path) -> None:
    s = chat_dataset(tmp_path, reset=False)[0]
    assert torch.equal(s["position_ids"], torch.arange(SEQ))
    assert torch.equal(~s["attention_mask"][0], torch.ones(SEQ, SEQ).tril().bool())


def test_a_sample_that_begins_inside_a_conversation_has_no_loss_on_that_piece(tmp_path) -> None:
    packed, plain = chat_dataset(tmp_path), chat_dataset(tmp_path / "plain", reset=False)
    inside = [k for k in range(16) if packed._starts_inside(k)]
    assert inside, "some samples start inside a conversation"
    dropped = 0
    for k in inside:
        s, same = packed[k], plain[k]
        first_eod = int((s["tokens"] == EOD).nonzero()[0])
        assert s["loss_mask"][: first_eod + 1].sum() == 0
        dropped += int(same["loss_mask"][: first_eod + 1].sum())  # what runs on without the switches trains
        assert torch.equal(s["loss_mask"][first_eod + 1 :], same["loss_mask"][first_eod + 1 :])
    assert dropped > 0


def test_unpacked_samples_are_one_padded_conversation_each(tmp_path) -> None:
    dataset = chat_dataset(tmp_path, packing=False)
    assert type(dataset).__name__ == "UnpackedSFTDataset"
    lengths = dataset.dataset.sequence_lengths
    for k in range(8):
        s = dataset[k]
        n = int(lengths[dataset.document_index[k]])  # the conversation, its EOD included
        text = torch.cat([s["tokens"], s["labels"][-1:]])
        assert int(text[n - 1]) == EOD and int((text[: n - 1] == EOD).sum()) == 0
        assert torch.equal(s["position_ids"][:n], torch.arange(n))
        assert s["loss_mask"][n - 1 :].sum() == 0 and s["loss_mask"][: n - 1].sum() > 0  # padding carries none


def test_unpacked_needs_sft(tmp_path) -> None:
    from kilocard.data.datasets import dataset_class

    config = gpt_dataset_config(
        cfg_of({"data.type": "mock", "model.seq_length": SEQ}), get_tokenizer("kilocard-bytes"), None, False
    )
    with pytest.raises(DataError, match="data.packing: false"):
        dataset_class(config, sft=False, packing=False)


def test_thd_cu_seqlens_follow_the_restarting_positions(tmp_path) -> None:
    """What ``forward_step`` hands Transformer Engine (``PackedSeqParams``); computed, not run (no TE here)."""
    from kilocard.train.megatron_adapter import cu_seqlens, packed_seq_params

    s = chat_dataset(tmp_path, mask=False)[0]
    assert "attention_mask" not in s
    seg = segments(s["tokens"])
    bounds = [0] + [j for j in range(1, SEQ) if seg[j] != seg[j - 1]] + [SEQ]
    cu = cu_seqlens(s["position_ids"][None])
    assert cu.dtype == torch.int32 and cu.tolist() == bounds
    params = packed_seq_params(s["position_ids"][None])
    assert params.qkv_format == "thd" and params.max_seqlen_q == max(
        b - a for a, b in zip(bounds[:-1], bounds[1:], strict=True)
    )
    assert cu_seqlens(torch.tensor([[0, 1, 2, 0, 1], [0, 1, 0, 1, 2]])).tolist() == [0, 3, 5, 7, 10]


def test_the_attention_path_follows_the_backend() -> None:
    """Local attention takes the dataset's block-diagonal mask (Megatron-Core's fused causal softmax, which
    ignores a mask, stays off as kilocard leaves it); Transformer Engine takes THD, one sequence per
    micro-batch and no context parallelism."""
    from kilocard.backends import Backend
    from kilocard.train import megatron_adapter as ma

    packed = {"data.reset_position_ids": True, "data.reset_attention_mask": True, "trainer.micro_batch_size": 1}
    gpu_local = Backend(name="cuda", dist_backend="nccl", local_spec=True)
    gpu_te = Backend(name="cuda", dist_backend="nccl", local_spec=False)
    cfg = cfg_of(packed)
    assert ma.dataset_attention_mask(cfg, gpu_local) and not ma.packed_thd(cfg, gpu_local)
    assert ma.packed_thd(cfg, gpu_te) and not ma.dataset_attention_mask(cfg, gpu_te)
    assert not ma.transformer_config(cfg, gpu_local).masked_softmax_fusion  # its causal kernel ignores a mask
    ma.check_packed_thd(cfg, gpu_te)
    ma.check_packed_thd(cfg_of({**packed, "trainer.micro_batch_size": 2}), gpu_local)  # the mask takes any batch
    with pytest.raises(ma.UnsupportedConfig, match="trainer.micro_batch_size: 2 with data.reset_attention_mask"):
        ma.check_packed_thd(cfg_of({**packed, "trainer.micro_batch_size": 2}), gpu_te)
    with pytest.raises(ma.UnsupportedConfig, match="parallel.context_parallel_size: 2"):
        ma.check_packed_thd(cfg_of({**packed, "parallel.context_parallel_size": 2}), gpu_te)
