#!/usr/bin/env python
"""Step time of kilocard's trainer versus a bare Megatron-Core loop (same model, same layout, same data), CPU ranks.

    .venv/bin/python scripts/bench_train_overhead.py [--nproc 2] [--blocks 12] [--block-steps 10] [OVERRIDES ...]

Both loops run INSIDE THE SAME torchrun ranks, alternating in blocks of ``--block-steps`` steps:
one ``Trainer.run`` of ``blocks * block_steps + 1`` steps, and after every ``block_steps``-th step's
record a block of bare steps, run right there on every rank (the trainer's loop pauses; no
checkpoint is written between blocks). A change in the machine's load (these are shared virtual
machines: the same run varies by +-15% from one minute to the next) thus hits both sides alike;
separate processes per side, run one after the other, could not resolve a 5% difference here.

* ours: kilocard's ``Trainer`` built exactly as ``python -m kilocard.train`` builds it (backend,
  parallel state, seeds, model, DDP, distributed optimizer, LR schedule, watchdog, stop flag) and
  its ``run`` loop with rank 0's real ``MetricsWriter`` (metrics.jsonl and TensorBoard on). A
  step's time is the period between two consecutive metrics records on rank 0: everything the loop
  does per step (the loss and stop-flag all-reduce, the record, the scalars), not only the timed part.
* bare: GPTModel + DDP + optimizer built inline with Megatron-Core, the masked-mean LM loss of
  Megatron-LM's ``pretrain_gpt``, ``get_forward_backward_func`` + ``optimizer.step`` and nothing
  else; a step's time is the period between two loop-iteration ends on rank 0.

Both read the same data the same way: kilocard's ``build_train_iterator`` (mock data by default),
no attention mask (causal). The first period of every block is dropped (caches warm after the
switch), and so is the ours period that spans a bare block.
Two clocks: wall-clock step period (what the target is about) and rank 0's CPU time per step
(``time.process_time``, all threads, so TensorBoard's and the watchdog's threads count). Printed:
each side's median period, their ratio, and the median of the per-block-pair ratios; target <= 1.05.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

Stamp = list[float]


def _stamp() -> Stamp:
    """(wall seconds, CPU seconds of this process, all threads) now."""
    return [time.perf_counter(), time.process_time()]


def _periods(stamps: list[Stamp]) -> dict[str, list[float]]:
    """Wall and CPU time between consecutive stamps, the first period (warm-up after a switch) dropped."""
    return {
        k: [b[i] - a[i] for a, b in zip(stamps[1:], stamps[2:], strict=False)] for i, k in enumerate(("wall", "cpu"))
    }


def build_ours(run_dir: Path) -> Any:
    """kilocard's trainer on this rank, set up as ``kilocard.train.entry`` sets it up; returns (trainer, "
    "writer, stamps)."""
    import torch.distributed as dist

    from kilocard.backends import select
    from kilocard.rundir.freeze import load_verified
    from kilocard.rundir.metrics import MetricsWriter
    from kilocard.train import entry
    from kilocard.train.dist_env import resolve
    from kilocard.train.signals import StopFlag, Watchdog

    env = resolve(os.environ)
    run_cfg, sha = load_verified(run_dir)
    stop = StopFlag()
    stop.install()
    watchdog = Watchdog(run_cfg.trainer.hang_timeout_s, env.rank).start()
    backend = select(env.local_rank)
    entry._deterministic(run_cfg.trainer.deterministic)
    dist.init_process_group(backend.dist_backend)
    trainer = entry.build_trainer(run_dir, run_cfg, sha, backend, stop, watchdog, timeout_minutes=10)
    stamps: list[Stamp] = []
    writer = None
    if dist.get_rank() == 0:
        writer = MetricsWriter(run_dir, run_cfg.trainer.tensorboard, resume_step=0)
        write = writer.write

        def stamped(record: dict[str, Any]) -> None:
            write(record)
            stamps.append(_stamp())

        writer.write = stamped  # type: ignore[method-assign]
    return trainer, writer, stamps


def build_bare(run_dir: Path) -> Callable[[int], list[Stamp]]:
    """The bare Megatron-Core model, DDP and optimizer (parallel state already up); returns ``block(steps)``."""
    import torch
    import torch.nn.functional as F
    from megatron.core import parallel_state as ps
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig, finalize_model_grads
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.pipeline_parallel import get_forward_backward_func
    from megatron.core.transformer.transformer_config import TransformerConfig

    from kilocard.data.iterator import build_train_iterator
    from kilocard.rundir.freeze import load_verified

    rc, _ = load_verified(run_dir)
    m, p, t, o = rc.model, rc.parallel, rc.trainer, rc.optim
    cfg = TransformerConfig(
        num_layers=m.num_layers,
        hidden_size=m.hidden_size,
        ffn_hidden_size=m.ffn_hidden_size,
        num_attention_heads=m.num_attention_heads,
        num_query_groups=m.num_query_groups,
        normalization=m.normalization,
        layernorm_epsilon=m.layernorm_epsilon,
        init_method_std=m.init_method_std,
        gated_linear_unit=True,
        activation_func=F.silu,
        add_bias_linear=m.add_bias_linear,
        hidden_dropout=m.hidden_dropout,
        attention_dropout=m.attention_dropout,
        tensor_model_parallel_size=p.tensor_model_parallel_size,
        pipeline_model_parallel_size=p.pipeline_model_parallel_size,
        sequence_parallel=p.sequence_parallel,
        pipeline_dtype=torch.float32,
        use_cpu_initialization=True,
        gradient_accumulation_fusion=False,
        bias_activation_fusion=False,
        bias_dropout_fusion=False,
        masked_softmax_fusion=False,
        persist_layer_norm=False,
        apply_rope_fusion=False,
        batch_p2p_sync=False,
        deterministic_mode=t.deterministic,
    )
    mult = m.make_vocab_size_divisible_by * p.tensor_model_parallel_size
    vocab = (m.vocab_size + mult - 1) // mult * mult
    model = GPTModel(
        config=cfg,
        transformer_layer_spec=get_gpt_layer_local_spec(normalization=m.normalization),
        vocab_size=vocab,
        max_sequence_length=m.max_position_embeddings,
        pre_process=ps.is_pipeline_first_stage(),
        post_process=ps.is_pipeline_last_stage(),
        share_embeddings_and_output_weights=m.share_embeddings_and_output_weights,
        position_embedding_type=m.position_embedding_type,
        rotary_base=m.rotary_base,
    )
    model = DistributedDataParallel(
        config=cfg,
        module=model,
        ddp_config=DistributedDataParallelConfig(
            grad_reduce_in_fp32=True, use_distributed_optimizer=p.use_distributed_optimizer
        ),
    )
    opt = get_megatron_optimizer(
        OptimizerConfig(
            optimizer="adam",
            lr=o.lr,
            weight_decay=o.weight_decay,
            adam_beta1=o.adam_beta1,
            adam_beta2=o.adam_beta2,
            adam_eps=o.adam_eps,
            clip_grad=o.clip_grad,
            use_distributed_optimizer=p.use_distributed_optimizer,
        ),
        [model],
    )
    cfg.no_sync_func, cfg.finalize_model_grads_func = model.no_sync, finalize_model_grads
    cfg.grad_scale_func = opt.scale_loss
    dp = ps.get_data_parallel_world_size()
    n_micro = t.global_batch_size // (t.micro_batch_size * dp)
    it = build_train_iterator(
        rc,
        dp_rank=ps.get_data_parallel_rank(),
        dp_size=dp,
        consumed_samples=0,
        cache_dir=str(run_dir / "data_cache"),
        create_attention_mask=False,
    )

    def fwd(data, mdl):
        batch = next(data)
        outp = mdl(batch["tokens"], batch["position_ids"], None, labels=batch["labels"])
        lm = batch["loss_mask"].view(-1).float()

        def loss_func(o_):
            loss = torch.sum(o_.float().view(-1) * lm) / lm.sum().clamp(min=1.0)
            return loss, {"lm loss": loss.detach().clone()}

        return outp, loss_func

    fb = get_forward_backward_func()

    def block(steps: int) -> list[Stamp]:
        stamps = [_stamp()]
        for _ in range(steps):
            model.zero_grad_buffer()
            opt.zero_grad()
            fb(
                forward_step_func=fwd,
                data_iterator=it,
                model=[model],
                num_microbatches=n_micro,
                seq_length=m.seq_length,
                micro_batch_size=t.micro_batch_size,
                forward_only=False,
            )
            opt.step()
            stamps.append(_stamp())
        return stamps

    return block


def rank_main(run_dir: Path, blocks: int, block_steps: int, out: Path) -> None:
    """One rank (under torchrun): the trainer's run, with a bare block after each ours block; rank 0 writes periods."""
    import torch.distributed as dist

    from kilocard.train.trainer import Outcome

    trainer, writer, ours_stamps = build_ours(run_dir)
    bare = build_bare(run_dir)
    results: list[dict[str, Any]] = []
    settle = trainer._settle

    def settle_then_bare(f: Any, w: Any, next_start: Any) -> bool:
        """After every ``block_steps``-th step's record: close the ours block, run a bare block (all ranks)."""
        stop = settle(f, w, next_start)
        if next_start is not None and f.step % block_steps == 0:
            block = f.step // block_steps - 1
            results.append({"block": block, "side": "ours", **_periods(ours_stamps)})
            ours_stamps.clear()
            results.append({"block": block, "side": "bare", **_periods(bare(block_steps))})
        return stop

    trainer._settle = settle_then_bare  # the loop reads each step's loss here, one step late, on every rank
    try:
        if trainer.run(writer) is not Outcome.DONE:
            raise SystemExit("the trainer stopped early")
    finally:
        if writer is not None:
            writer.close()
        trainer.watchdog.stop()
    if dist.get_rank() == 0:
        out.write_text(json.dumps(results))
    from megatron.core import parallel_state as ps

    ps.destroy_model_parallel()
    dist.destroy_process_group()


def summarize(results: list[dict[str, Any]]) -> list[str]:
    """Lines: per clock, each side's median period, the ratio of medians and the median paired ratio."""
    lines = []
    blocks = sorted({r["block"] for r in results})
    for k, what in (("wall", "wall-clock step period"), ("cpu", "rank-0 CPU time per step (all threads)")):
        side = {s: [v for r in results if r["side"] == s for v in r[k]] for s in ("ours", "bare")}
        per_block = {(r["block"], r["side"]): statistics.median(r[k]) for r in results}
        paired = [per_block[b, "ours"] / per_block[b, "bare"] for b in blocks]
        mo, mb = statistics.median(side["ours"]), statistics.median(side["bare"])
        lines.append(
            f"{what}: kilocard trainer median {mo * 1e3:.2f} ms ({len(side['ours'])} steps), bare "
            f"Megatron-Core median {mb * 1e3:.2f} ms ({len(side['bare'])} steps), ratio of medians "
            f"{mo / mb:.3f}, median of {len(paired)} per-block-pair ratios {statistics.median(paired):.3f} "
            f"(range {min(paired):.3f}-{max(paired):.3f}; target <= 1.05)"
        )
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--blocks", type=int, default=12, help="block pairs (ours + bare)")
    ap.add_argument("--block-steps", type=int, default=10, help="steps per block (the first period is dropped)")
    ap.add_argument("--rank", default=None, help=argparse.SUPPRESS)
    ap.add_argument("overrides", nargs="*", help="Hydra overrides (default: recipe=tiny_gpt)")
    a = ap.parse_args()
    if a.rank:
        rank_main(Path(a.rank), a.blocks, a.block_steps, Path(os.environ["KILOCARD_BENCH_OUT"]))
        return 0
    from kilocard.base.net import free_port
    from kilocard.config.compose import compose
    from kilocard.launch.rundir import create_run_dir

    work = Path(tempfile.mkdtemp(prefix="kilocard-bench-"))
    total = a.blocks * a.block_steps + 1  # + 1: the last ours block's record is read before the run's end
    overrides = (a.overrides or ["recipe=tiny_gpt"]) + [
        f"trainer.train_iters={total}",
        f"cluster.gpus_per_node={a.nproc}",
    ]
    run_dir = create_run_dir(compose(overrides), overrides, root=work)
    out = work / "periods.json"
    env = dict(os.environ, OMP_NUM_THREADS="1", TMPDIR=str(work), KILOCARD_BENCH_OUT=str(out))
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc-per-node={a.nproc}",
        f"--master-port={free_port()}",
        __file__,
        "--rank",
        str(run_dir),
        f"--blocks={a.blocks}",
        f"--block-steps={a.block_steps}",
    ]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"benchmark ranks failed ({r.returncode}):\n{r.stderr[-3000:]}")
    results = json.loads(out.read_text())
    print(
        f"layout: {' '.join(overrides)} on {a.nproc} CPU ranks; {a.blocks} block pairs of {a.block_steps} steps "
        f"per side, alternating inside the same ranks; data: build_train_iterator on both sides"
    )
    for line in summarize(results):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
