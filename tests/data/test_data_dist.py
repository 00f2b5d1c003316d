"""``build_train_iterator`` on two gloo ranks: Megatron-Core builds the index cache on rank 0, barriers,
and rank 1 loads it; each DP rank reads its own slice of every global batch.

The ranks are forked from the test process (which has already imported torch and Megatron-Core),
so the test costs no fresh interpreter start-ups.
"""

from __future__ import annotations

import multiprocessing
import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import kilocard.data.datasets  # noqa: F401  (imported before the fork, so the ranks need not)
from kilocard.config.compose import compose, to_run_config
from kilocard.config.schema import RunConfig
from kilocard.data.iterator import build_train_iterator

pytestmark = pytest.mark.integration  # two gloo ranks (torch) read one index cache

WORLD = 2
STEPS = 4


def _worker(cfg: RunConfig, rank: int, store: str, cache: str, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD)
    it = build_train_iterator(cfg, dp_rank=rank, dp_size=WORLD, cache_dir=cache)
    torch.save([next(it)["tokens"] for _ in range(STEPS)], out.format(rank=rank))
    dist.barrier()
    dist.destroy_process_group()


def test_two_gloo_ranks_share_one_index_cache_and_split_each_batch(tmp_path: Path) -> None:
    cache, out = tmp_path / "cache", str(tmp_path / "rank{rank}.pt")
    cfg2 = to_run_config(compose(["recipe=tiny_gpt", "data=tiny_corpus", "trainer.micro_batch_size=2"]))
    fork = multiprocessing.get_context("fork")
    procs = [
        fork.Process(target=_worker, args=(cfg2, r, str(tmp_path / "store"), str(cache), out)) for r in range(WORLD)
    ]
    for p in procs:
        p.start()
    try:
        for p in procs:
            p.join(timeout=120)
    finally:
        for p in procs:
            if p.is_alive():
                os.kill(p.pid, 9)
    assert [p.exitcode for p in procs] == [0, 0]
    assert len(list(cache.glob("*-GPTDataset-train-shuffle_index.npy"))) == 1  # built once, shared
    ranks = [torch.load(out.format(rank=r)) for r in range(WORLD)]
    cfg = to_run_config(compose(["recipe=tiny_gpt", "data=tiny_corpus", "trainer.micro_batch_size=4"]))
    whole = build_train_iterator(cfg, dp_rank=0, dp_size=1, cache_dir=str(tmp_path / "single"))
    for step in range(STEPS):
        assert torch.equal(torch.cat([ranks[0][step], ranks[1][step]]), next(whole)["tokens"])
