"""Worker (run under torchrun, gloo, CPU shim): load imported checkpoints into the trainer's Megatron-Core
model in several layouts and write the logits' max difference from transformers' reference.

``python -m torch.distributed.run --nproc-per-node 2 mcore_forward.py PLAN.json OUT_DIR``; PLAN is a
list of cases ``{"name", "ckpt", "tp", "pp", "ep", "tokens", "reference"}`` (``.pt`` files; optionally ``"etp"``,
the expert tensor-parallel size, TP's by default). Every case
re-initialises Megatron-Core's parallel state in the same two-rank group, builds the model with
``train.megatron_adapter`` (as the trainer does), loads ``ckpt/step_0000000`` with
``dist_checkpointing`` (resharding onto the layout), and runs the forward-only pipeline schedule.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist


def run_case(case: dict, out_dir: Path, backend) -> None:
    from megatron.core import dist_checkpointing
    from megatron.core import parallel_state as ps
    from megatron.core.pipeline_parallel import get_forward_backward_func

    from kilocard.config.schema import ModelConfig, ParallelConfig, RunConfig
    from kilocard.layout import of_sizes
    from kilocard.train import megatron_adapter as ma

    sdir = Path(case["ckpt"]) / "step_0000000"
    saved = json.loads((sdir / "trainer_state.json").read_text())["model"]
    parallel = ParallelConfig(
        tensor_model_parallel_size=case["tp"],
        pipeline_model_parallel_size=case["pp"],
        expert_model_parallel_size=case["ep"],
        expert_tensor_parallel_size=case.get("etp"),
    )
    run_cfg = dataclasses.replace(RunConfig(), model=ModelConfig(**saved), parallel=parallel)
    lay = of_sizes(dist.get_world_size(), case["tp"], case["pp"], ep=case["ep"], etp=case.get("etp"))
    ma.init_parallel_state(lay, timeout_minutes=5)
    ma.seed_all(1234)
    config = ma.transformer_config(run_cfg, backend)
    (model,) = ma.build_model_chunks(run_cfg, config, backend)
    loaded = dist_checkpointing.load({"model": model.sharded_state_dict()}, str(sdir))
    model.load_state_dict(loaded["model"], strict=True)
    model.eval()
    if dist.get_rank() == 0 and hasattr(
        model, "rotary_pos_emb"
    ):  # (MLA keeps its own) RoPE frequencies (Llama 3.1 scaling) are compared directly: short test
        # sequences barely turn the scaled low frequencies, so logits alone would not show a wrong scaling
        torch.save(model.rotary_pos_emb.inv_freq, out_dir / f"{case['name']}.inv_freq.pt")
    tokens = torch.load(case["tokens"])
    b, s = tokens.shape
    batch = {"tokens": tokens, "position_ids": torch.arange(s).unsqueeze(0).expand(b, -1)}

    def forward_step(data_iterator, chunk):
        x = next(data_iterator)
        out = chunk(x["tokens"], x["position_ids"], None, runtime_gather_output=True)
        return out, lambda output, non_loss_data=False: output

    with torch.no_grad():
        collected = get_forward_backward_func()(
            forward_step_func=forward_step,
            data_iterator=iter([batch]),
            model=[model],
            num_microbatches=1,
            seq_length=s,
            micro_batch_size=b,
            forward_only=True,
            collect_non_loss_data=True,
        )
    if ps.is_pipeline_last_stage() and collected:
        reference = torch.load(case["reference"])
        logits = collected[0].float()[..., : reference.shape[-1]]
        result = {"max_abs_diff": (logits - reference).abs().max().item(), "shape": list(logits.shape)}
        (out_dir / f"{case['name']}.rank{dist.get_rank()}.json").write_text(json.dumps(result))
    dist.barrier()
    ps.destroy_model_parallel()


def main() -> None:
    from kilocard.backends import select
    from kilocard.train.dist_env import resolve

    env = resolve(os.environ)
    backend = select(env.local_rank)
    dist.init_process_group(backend.dist_backend)
    plan, out_dir = json.loads(Path(sys.argv[1]).read_text()), Path(sys.argv[2])
    try:
        for case in plan:
            run_case(case, out_dir, backend)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
