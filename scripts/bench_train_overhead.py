#!/usr/bin/env python
"""Step time of kilocard's trainer versus a bare Megatron-Core loop (same model, same layout), CPU ranks.

    .venv/bin/python scripts/bench_train_overhead.py [--nproc 2] [--steps 30] [OVERRIDES ...]

Runs ``python -m kilocard.train`` on a fresh run directory (step times from metrics.jsonl), then
this script's own bare loop under torchrun: GPTModel + DDP + optimizer built inline with
Megatron-Core, the same synthetic batches shape, ``get_forward_backward_func`` + ``optimizer.step``
and nothing else. Each side runs ``--rounds`` times, alternating; it prints the best per-run median
step time of each side (first 3 steps dropped) and their ratio; the target is a ratio <= 1.05.
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

WARMUP = 3


def bare_loop(run_dir: Path, out: Path) -> None:
    """One rank of the bare Megatron-Core loop (runs under torchrun)."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    from kilocard.backends import cpu_shim
    from kilocard.config.freeze import load_verified

    cpu_shim.apply()
    rc, _ = load_verified(run_dir)
    m, p, t, o = rc.model, rc.parallel, rc.trainer, rc.optim
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
        gated_linear_unit=True, activation_func=F.silu, add_bias_linear=m.add_bias_linear,
        hidden_dropout=0.0, attention_dropout=0.0, tensor_model_parallel_size=p.tensor_model_parallel_size,
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
                     position_embedding_type=m.position_embedding_type)
    model = DistributedDataParallel(config=cfg, module=model, ddp_config=DistributedDataParallelConfig(
        grad_reduce_in_fp32=True, use_distributed_optimizer=p.use_distributed_optimizer))
    opt = get_megatron_optimizer(OptimizerConfig(optimizer="adam", lr=o.lr, weight_decay=o.weight_decay,
                                                 clip_grad=o.clip_grad, use_distributed_optimizer=p.use_distributed_optimizer),
                                 [model])
    cfg.no_sync_func, cfg.finalize_model_grads_func = model.no_sync, finalize_model_grads
    dp = ps.get_data_parallel_world_size()
    n_micro = t.global_batch_size // (t.micro_batch_size * dp)
    s, b = m.seq_length, t.micro_batch_size
    g = torch.Generator().manual_seed(ps.get_data_parallel_rank())
    mask = None  # causal: Megatron-Core builds the mask
    pos = torch.arange(s).unsqueeze(0).expand(b, -1)

    def batches():
        while True:
            x = torch.randint(0, m.vocab_size, (b, s + 1), generator=g)
            yield x[:, :-1], x[:, 1:]

    def fwd(it, mdl):
        tok, lab = next(it)
        outp = mdl(tok, pos, mask, labels=lab)
        return outp, lambda o_: (o_.float().mean(), {"lm loss": o_.float().mean().detach().clone()})

    fb, it, times = get_forward_backward_func(), batches(), []
    for _ in range(t.train_iters):
        t0 = time.perf_counter()
        model.zero_grad_buffer()
        opt.zero_grad()
        fb(forward_step_func=fwd, data_iterator=it, model=[model], num_microbatches=n_micro, seq_length=s,
           micro_batch_size=b, forward_only=False)
        opt.step()
        times.append(time.perf_counter() - t0)
    if dist.get_rank() == 0:
        out.write_text(json.dumps(times))
    ps.destroy_model_parallel()
    dist.destroy_process_group()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds; the best median of each side counts")
    ap.add_argument("--bare", default=None, help=argparse.SUPPRESS)
    ap.add_argument("overrides", nargs="*", help="Hydra overrides (default: recipe=tiny_gpt)")
    a = ap.parse_args()
    if a.bare:
        bare_loop(Path(a.bare), Path(os.environ["KILOCARD_BENCH_OUT"]))
        return 0
    from kilocard.config.compose import compose
    from kilocard.launch.rundir import create_run_dir
    from kilocard.train.dist_env import free_port
    from kilocard.train.metrics import read_metrics

    work = Path(tempfile.mkdtemp(prefix="kilocard-bench-"))
    overrides = (a.overrides or ["recipe=tiny_gpt"]) + [
        f"trainer.train_iters={a.steps}", f"cluster.gpus_per_node={a.nproc}", "trainer.tensorboard=false"]
    ours_runs, bare_runs = [], []
    for r in range(a.rounds):  # alternate, so a load change on a shared machine hits both sides
        run_dir = create_run_dir(compose(overrides), overrides, root=work)
        env = dict(os.environ, OMP_NUM_THREADS="1", TMPDIR=str(work), KILOCARD_BENCH_OUT=str(work / f"bare{r}.json"))
        tr = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={a.nproc}"]
        subprocess.run(tr + [f"--master-port={free_port()}", "-m", "kilocard.train", str(run_dir)], env=env,
                       check=True, capture_output=True)
        subprocess.run(tr + [f"--master-port={free_port()}", __file__, "--bare", str(run_dir)], env=env, check=True,
                       capture_output=True)
        ours_runs.append(statistics.median([m["step_time_s"] for m in read_metrics(run_dir)][WARMUP:]))
        bare_runs.append(statistics.median(json.loads((work / f"bare{r}.json").read_text())[WARMUP:]))
    mo, mb = min(ours_runs), min(bare_runs)
    print(f"layout: {' '.join(overrides)} on {a.nproc} CPU ranks, {a.steps} steps (first {WARMUP} dropped), "
          f"best of {a.rounds} alternating rounds")
    print(f"kilocard trainer   median step {mo * 1e3:8.2f} ms")
    print(f"bare Megatron-Core median step {mb * 1e3:8.2f} ms")
    print(f"ratio {mo / mb:.3f} (target <= 1.05)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
