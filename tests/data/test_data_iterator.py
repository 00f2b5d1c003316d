"""``build_train_iterator``: Megatron-Core Mock/GPT datasets, micro-batch shapes, resume position, DP slices.

Single process, torch.distributed not initialised (Megatron-Core's builder then builds on the
caller); the collective path on gloo ranks is in test_data_dist.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kilocard.config.compose import compose, to_run_config
from kilocard.config.schema import RunConfig
from kilocard.data.errors import DataError
from kilocard.data.iterator import build_train_iterator
from kilocard.data.tokenizer import get_tokenizer

pytestmark = pytest.mark.integration  # Megatron-Core's datasets and torch's DataLoader

SHAPES = {"tokens": torch.int64, "labels": torch.int64, "loss_mask": torch.float32, "position_ids": torch.int64}


def _cfg(*overrides: str) -> RunConfig:
    return to_run_config(compose(["recipe=tiny_gpt", *overrides]))


def _take(cfg: RunConfig, cache: Path, n: int, **kw) -> list[dict]:
    it = build_train_iterator(cfg, cache_dir=str(cache), **kw)
    return [next(it) for _ in range(n)]


@pytest.mark.parametrize("data", ["mock", "tiny_corpus"])
def test_micro_batches_have_gpt_model_shapes_and_dtypes(tmp_path: Path, data: str) -> None:
    cfg = _cfg(f"data={data}", "trainer.micro_batch_size=3", "trainer.global_batch_size=6", "model.seq_length=32")
    it = build_train_iterator(cfg, dp_rank=0, dp_size=1, cache_dir=str(tmp_path))
    assert len(it) == cfg.trainer.train_iters * 2
    batch = next(it)
    for key, dtype in SHAPES.items():
        assert batch[key].shape == (3, 32) and batch[key].dtype == dtype, key
    assert batch["attention_mask"].shape == (3, 1, 32, 32) and batch["attention_mask"].dtype == torch.bool
    assert torch.equal(batch["attention_mask"][0, 0], torch.ones(32, 32, dtype=torch.bool).triu(1))  # causal
    assert torch.equal(batch["position_ids"][1], torch.arange(32))
    assert torch.equal(batch["labels"][:, :-1], batch["tokens"][:, 1:])  # next-token targets
    assert int(batch["tokens"].max()) < get_tokenizer("kilocard-bytes").vocab_size <= cfg.model.vocab_size
    assert bool((batch["loss_mask"] == 1.0).all())
    assert it.consumed_samples == 3


def test_indexed_batches_are_the_corpus_text(tmp_path: Path) -> None:
    batch = _take(_cfg("data=tiny_corpus"), tmp_path, 1, dp_rank=0, dp_size=1, create_attention_mask=False)[0]
    assert batch["attention_mask"] is None
    text = get_tokenizer("kilocard-bytes").detokenize(batch["tokens"][0])
    assert sum(ch.isalpha() or ch in " .,\n'\"" for ch in text) >= 0.9 * len(text)  # English prose, not noise


@pytest.mark.parametrize("data", ["mock", "tiny_corpus"])
def test_resume_at_consumed_samples_sees_the_uninterrupted_batches(tmp_path: Path, data: str) -> None:
    """Loss masks included: Megatron's mask cache must not make a sample depend on the first one read."""
    cfg = _cfg(f"data={data}", "trainer.micro_batch_size=2", "trainer.global_batch_size=8", "trainer.train_iters=6")
    micro_per_step = 4
    full = _take(cfg, tmp_path, 6 * micro_per_step, dp_rank=0, dp_size=1)
    resumed = build_train_iterator(cfg, dp_rank=0, dp_size=1, consumed_samples=3 * 8, cache_dir=str(tmp_path))
    assert len(resumed) == 3 * micro_per_step
    for expected in full[3 * micro_per_step :]:
        got = next(resumed)
        assert all(torch.equal(got[k], expected[k]) for k in SHAPES)
    with pytest.raises(StopIteration):
        next(resumed)
    assert resumed.consumed_samples == 6 * 8


@pytest.mark.parametrize("data", ["mock", "tiny_corpus"])
def test_dp_ranks_read_disjoint_slices_of_each_global_batch(tmp_path: Path, data: str) -> None:
    """DP=2 with mbs=2 reads, per micro step, exactly the 4 samples a DP=1 run with mbs=4 reads."""
    cfg2 = _cfg(f"data={data}", "trainer.micro_batch_size=2", "trainer.global_batch_size=8")
    cfg1 = _cfg(f"data={data}", "trainer.micro_batch_size=4", "trainer.global_batch_size=8")
    ranks = [_take(cfg2, tmp_path, 4, dp_rank=r, dp_size=2) for r in range(2)]
    whole = _take(cfg1, tmp_path, 4, dp_rank=0, dp_size=1)
    for step in range(4):
        joined = torch.cat([ranks[0][step]["tokens"], ranks[1][step]["tokens"]])
        assert torch.equal(joined, whole[step]["tokens"])
        assert not torch.equal(ranks[0][step]["tokens"], ranks[1][step]["tokens"])


def test_relative_data_path_resolves_from_any_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert len(_take(_cfg("data=tiny_corpus"), tmp_path / "cache", 1, dp_rank=0, dp_size=1)) == 1


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["data.type=indexed", "data.data_path=[no/such/prefix]"], "data.data_path: 'no/such/prefix' not found"),
        (["data.type=indexed", "data.data_path=[]"], "data.data_path: empty"),
        (["data=tiny_corpus", "data.split='0,1,0'"], "gives the train split no share"),
        (
            ["data=tiny_corpus", "model.vocab_size=256"],
            "model.vocab_size: 256 (padded to 256) is smaller than tokenizer",
        ),
        (
            ["trainer.global_batch_size=6", "trainer.micro_batch_size=4"],
            "trainer.global_batch_size: 6 is not a multiple",
        ),
        (["data.type=shards"], "data.type: 'shards' is not one of"),
        (["data.tokenizer=gpt9"], "data.tokenizer: unknown tokenizer 'gpt9'"),
    ],
)
def test_bad_data_config_is_one_data_error(tmp_path: Path, overrides: list, message: str) -> None:
    with pytest.raises(DataError) as err:
        build_train_iterator(_cfg(*overrides), dp_rank=0, dp_size=1, cache_dir=str(tmp_path))
    assert message in str(err.value) and "fix:" in str(err.value) and "\n" not in str(err.value)


def test_consumed_samples_beyond_the_run_is_refused(tmp_path: Path) -> None:
    cfg = _cfg("trainer.train_iters=2")
    with pytest.raises(DataError, match="consumed_samples: 24 is outside"):
        build_train_iterator(cfg, dp_rank=0, dp_size=1, consumed_samples=24, cache_dir=str(tmp_path))


def test_resume_where_the_first_sample_read_has_padding_keeps_later_masks(tmp_path: Path) -> None:
    """Megatron-Core caches the first sample's loss mask before zeroing its pad positions in place;
    a resume whose first sample is padded must still give every later sample its own mask."""
    cfg = _cfg("data=mock", "trainer.micro_batch_size=1", "trainer.global_batch_size=1", "trainer.train_iters=48")
    full = _take(cfg, tmp_path, 48, dp_rank=0, dp_size=1)
    padded = [i for i, b in enumerate(full) if i > 0 and bool((b["loss_mask"] == 0).any())]
    assert padded, "the mock data should hold padded samples"
    start = padded[0]
    resumed = build_train_iterator(cfg, dp_rank=0, dp_size=1, consumed_samples=start, cache_dir=str(tmp_path))
    for expected in full[start:]:
        got = next(resumed)
        assert torch.equal(got["loss_mask"], expected["loss_mask"])


@pytest.mark.parametrize("data", ["mock", "tiny_corpus"])
def test_eval_batches_read_the_validation_split_in_data_parallel_slices(tmp_path: Path, data: str) -> None:
    """The validation split is not the train split, and two DP ranks read the halves of what one rank reads."""
    from kilocard.data.iterator import build_eval_dataset, eval_batches
    from kilocard.data.split import TEST, VALID

    cfg = _cfg(f"data={data}", "trainer.micro_batch_size=2", "trainer.global_batch_size=8", "trainer.eval_interval=3")
    valid = build_eval_dataset(cfg, VALID, dp_size=1, cache_dir=str(tmp_path))
    assert valid is not None and build_eval_dataset(cfg, TEST, dp_size=1, cache_dir=str(tmp_path)) is not None
    one = list(eval_batches(valid, cfg, start=8, rounds=2, dp_rank=0, dp_size=1))
    assert len(one) == 8 and one[0]["tokens"].shape == (2, cfg.model.seq_length)
    halves = [list(eval_batches(valid, cfg, start=8, rounds=2, dp_rank=r, dp_size=2)) for r in (0, 1)]
    assert all(len(h) == 4 for h in halves)
    for k in range(4):  # micro step k of DP rank r is micro step 2k + r of one rank
        for r in (0, 1):
            assert torch.equal(halves[r][k]["tokens"], one[2 * k + r]["tokens"])
    train = _take(cfg, tmp_path, 1, dp_rank=0, dp_size=1)[0]
    assert not torch.equal(train["tokens"], one[0]["tokens"])


def test_a_test_split_without_documents_is_skipped_not_an_error(tmp_path: Path) -> None:
    from kilocard.data.iterator import build_eval_dataset
    from kilocard.data.split import TEST

    cfg = _cfg("data=tiny_corpus", "trainer.eval_interval=3", "data.split='99,1,0'")
    assert build_eval_dataset(cfg, TEST, dp_size=1, cache_dir=str(tmp_path)) is None
