#!/usr/bin/env python
"""Step time of kilocard's trainer versus a bare Megatron-Core loop (same model, same layout, same data), CPU ranks.

    .venv/bin/python scripts/bench_train_overhead.py [--nproc 2] [--steps 60] [--rounds 5] [OVERRIDES ...]

Both sides run under torchrun on the same frozen run directory and read the SAME data the SAME way:
kilocard's ``build_train_iterator`` (the run's ``data`` config; mock data by default), one iterator
per rank at this data-parallel rank, no attention mask (causal), exactly as the trainer builds it.

* ours: the real entry point (``kilocard.train.entry.main``) with its default options (TensorBoard
  on, metrics.jsonl, watchdog, stop-flag agreement, LR schedule); rank 0's ``MetricsWriter.write`` is
  wrapped to stamp the clocks after each step's record, so a step's time is the full
  loop period between two records: everything the loop does per step, not only the timed part.
* bare: GPTModel + DDP + optimizer built inline with Megatron-Core, the masked-mean LM loss of
  Megatron-LM's ``pretrain_gpt``, ``get_forward_backward_func`` + ``optimizer.step`` and nothing
  else; a step's time is the period between two loop-iteration ends on rank 0.

Two clocks: the wall-clock step period (what the target is about) and rank 0's CPU time per step
(``time.process_time``, all threads of the process, so TensorBoard's and the watchdog's threads
count), which a busy shared machine disturbs far less than wall-clock time. The sides alternate
(ours, bare, ours, bare, ...) for ``--rounds`` rounds so a load change hits both; each run's median
(first ``WARMUP`` periods dropped) is one sample; the script prints, per clock, the median over
rounds of each side, their ratio, and the median of the per-round (paired) ratios; target <= 1.05.
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
from pathlib import Path
from typing import Dict, List

WARMUP = 3


def _stamp() -> List[float]:
    """(wall seconds, CPU seconds of this process, all threads) now."""
    return [time.perf_counter(), time.process_time()]


def _periods(stamps: List[List[float]]) -> Dict[str, List[float]]:
    """Wall and CPU time between consecutive stamps."""
    return {k: [b[i] - a[i] for a, b in zip(stamps, stamps[1:])] for i, k in enumerate(("wall", "cpu"))}


def ours_loop(run_dir: Path, out: Path) -> None:
    """One rank of kilocard's trainer (runs under torchrun); rank 0 writes its step periods to ``out``."""
    from kilocard.train import entry, metrics

    stamps: List[List[float]] = []
    write = metrics.MetricsWriter.write

    def stamped(self, record):
        write(self, record)
        stamps.append(_stamp())

    metrics.MetricsWriter.write = stamped
    code = entry.main([str(run_dir)])
    if code != 0:
        raise SystemExit(f"kilocard.train exited {code}")
    if stamps:
        out.write_text(json.dumps(_periods(stamps)))


def bare_loop(run_dir: Path, out: Path) -> None:
    """One rank of the bare Megatron-Core loop (runs under torchrun); rank 0 writes its step periods."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    from kilocard.backends import cpu_shim
    from kilocard.config.freeze import load_verified
    from kilocard.data import build_train_iterator

    cpu_shim.apply()
    rc, _ = load_verified(run_dir)
    m, p, t, o = rc.model, rc.parallel, rc.trainer, rc.optim
    torch.use_deterministic_algorithms(t.deterministic)
    dist.init_process_group("gloo")
    from megatron.core import parallel_state as ps
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig, finalize_model_grads
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.pipeline_parallel import get_forward_backward_func
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    from megatron.core.transformer.transformer_config import TransformerConfig

    ps.initialize_model_parallel(p.tensor_model_parallel_size, p.pipeline_model_parallel_size)
    model_parallel_cuda_manual_seed(t.seed)
    torch.manual_seed(t.seed)
    cfg = TransformerConfig(
        num_layers=m.num_layers, hidden_size=m.hidden_size, ffn_hidden_size=m.ffn_hidden_size,
        num_attention_heads=m.num_attention_heads, num_query_groups=m.num_query_groups, normalization=m.normalization,
        layernorm_epsilon=m.layernorm_epsilon, init_method_std=m.init_method_std,
        gated_linear_unit=True, activation_func=F.silu, add_bias_linear=m.add_bias_linear,
        hidden_dropout=m.hidden_dropout, attention_dropout=m.attention_dropout,
        tensor_model_parallel_size=p.tensor_model_parallel_size,
        pipeline_model_parallel_size=p.pipeline_model_parallel_size, sequence_parallel=p.sequence_parallel,
        pipeline_dtype=torch.float32, use_cpu_initialization=True, gradient_accumulation_fusion=False,
        bias_activation_fusion=False, bias_dropout_fusion=False, masked_softmax_fusion=False,
        persist_layer_norm=False, apply_rope_fusion=False, batch_p2p_sync=False, deterministic_mode=t.deterministic)
    mult = m.make_vocab_size_divisible_by * p.tensor_model_parallel_size
    vocab = (m.vocab_size + mult - 1) // mult * mult
    model = GPTModel(config=cfg, transformer_layer_spec=get_gpt_layer_local_spec(normalization=m.normalization),
                     vocab_size=vocab, max_sequence_length=m.max_position_embeddings,
                     pre_process=ps.is_pipeline_first_stage(), post_process=ps.is_pipeline_last_stage(),
                     share_embeddings_and_output_weights=m.share_embeddings_and_output_weights,
                     position_embedding_type=m.position_embedding_type, rotary_base=m.rotary_base)
    model = DistributedDataParallel(config=cfg, module=model, ddp_config=DistributedDataParallelConfig(
        grad_reduce_in_fp32=True, use_distributed_optimizer=p.use_distributed_optimizer))
    opt = get_megatron_optimizer(OptimizerConfig(optimizer="adam", lr=o.lr, weight_decay=o.weight_decay,
                                                 adam_beta1=o.adam_beta1, adam_beta2=o.adam_beta2, adam_eps=o.adam_eps,
                                                 clip_grad=o.clip_grad, use_distributed_optimizer=p.use_distributed_optimizer),
                                 [model])
    cfg.no_sync_func, cfg.finalize_model_grads_func = model.no_sync, finalize_model_grads
    cfg.grad_scale_func = opt.scale_loss
    dp = ps.get_data_parallel_world_size()
    n_micro = t.global_batch_size // (t.micro_batch_size * dp)
    it = build_train_iterator(rc, dp_rank=ps.get_data_parallel_rank(), dp_size=dp, consumed_samples=0,
                              cache_dir=str(run_dir / "data_cache"), create_attention_mask=False)

    def fwd(data, mdl):
        batch = next(data)
        outp = mdl(batch["tokens"], batch["position_ids"], None, labels=batch["labels"])
        lm = batch["loss_mask"].view(-1).float()

        def loss_func(o_):
            loss = torch.sum(o_.float().view(-1) * lm) / lm.sum().clamp(min=1.0)
            return loss, {"lm loss": loss.detach().clone()}

        return outp, loss_func

    fb, stamps = get_forward_backward_func(), [_stamp()]
    for _ in range(t.train_iters):
        model.zero_grad_buffer()
        opt.zero_grad()
        fb(forward_step_func=fwd, data_iterator=it, model=[model], num_microbatches=n_micro, seq_length=m.seq_length,
           micro_batch_size=t.micro_batch_size, forward_only=False)
        opt.step()
        stamps.append(_stamp())
    if dist.get_rank() == 0:
        out.write_text(json.dumps(_periods(stamps)))
    ps.destroy_model_parallel()
    dist.destroy_process_group()


def _launch(side: str, run_dir: Path, out: Path, nproc: int, work: Path) -> Dict[str, float]:
    """Run one side under torchrun; the medians of its rank-0 step periods (wall, CPU), warm-up dropped."""
    from kilocard.train.dist_env import free_port

    env = dict(os.environ, OMP_NUM_THREADS="1", TMPDIR=str(work), KILOCARD_BENCH_OUT=str(out))
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}",
           f"--master-port={free_port()}", __file__, f"--{side}", str(run_dir)]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"{side} run failed ({r.returncode}):\n{r.stderr[-3000:]}")
    return {k: statistics.median(v[WARMUP:]) for k, v in json.loads(out.read_text()).items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--rounds", type=int, default=5, help="alternating rounds (ours, bare) ...; medians over rounds")
    ap.add_argument("--ours", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--bare", default=None, help=argparse.SUPPRESS)
    ap.add_argument("overrides", nargs="*", help="Hydra overrides (default: recipe=tiny_gpt)")
    a = ap.parse_args()
    if a.ours or a.bare:
        side = ours_loop if a.ours else bare_loop
        side(Path(a.ours or a.bare), Path(os.environ["KILOCARD_BENCH_OUT"]))
        return 0
    from kilocard.config.compose import compose
    from kilocard.launch.rundir import create_run_dir

    work = Path(tempfile.mkdtemp(prefix="kilocard-bench-"))
    overrides = (a.overrides or ["recipe=tiny_gpt"]) + [f"trainer.train_iters={a.steps}",
                                                        f"cluster.gpus_per_node={a.nproc}"]
    ours, bare = [], []
    for r in range(a.rounds):
        run_dir = create_run_dir(compose(overrides), overrides, root=work)
        ours.append(_launch("ours", run_dir, work / f"ours{r}.json", a.nproc, work))
        bare.append(_launch("bare", run_dir, work / f"bare{r}.json", a.nproc, work))
        print(f"round {r + 1}: ours {ours[-1]['wall'] * 1e3:.2f} ms (CPU {ours[-1]['cpu'] * 1e3:.2f}), "
              f"bare {bare[-1]['wall'] * 1e3:.2f} ms (CPU {bare[-1]['cpu'] * 1e3:.2f})", flush=True)
    print(f"layout: {' '.join(overrides)} on {a.nproc} CPU ranks, {a.steps} steps (first {WARMUP} dropped), "
          f"{a.rounds} alternating rounds; data: build_train_iterator on both sides")
    for k, what in (("wall", "wall-clock step period"), ("cpu", "rank-0 CPU time per step (all threads)")):
        mo, mb = (statistics.median(x[k] for x in side) for side in (ours, bare))
        paired = statistics.median(x[k] / y[k] for x, y in zip(ours, bare))
        print(f"{what}: kilocard trainer median {mo * 1e3:.2f} ms, bare Megatron-Core median {mb * 1e3:.2f} ms, "
              f"ratio of medians {mo / mb:.3f}, median of per-round ratios {paired:.3f} (target <= 1.05)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
