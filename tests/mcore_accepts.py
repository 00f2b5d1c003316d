"""Does Megatron-Core 0.16.1 itself accept a layout? Run as a script: JSON cases on stdin, verdicts out.

Each case is tried as every pipeline stage's first rank (and every virtual stage) of a world of
``world`` ranks, one process playing each rank in turn on torch's fake process group (``FakeStore``
+ backend ``fake``: collectives are no-ops, group creation is real). For each rank: ``
parallel_state.initialize_model_parallel``, ``TransformerConfig`` construction, ``GPTModel``
construction (local layer spec, CPU initialisation; its attention has no context parallelism,
which only Transformer Engine's has, so the model is built with CP 1 after the groups and the
config were checked with the real CP), and for an MoE model one training-mode
``MoELayer.forward`` (where Megatron-Core refuses MoE + TP without sequence parallelism).
A case is rejected when any of these raises.
"""

from __future__ import annotations

import json
import os
import sys
import warnings


def _try_rank(case: dict, rank: int) -> str | None:
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state as ps
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_config import TransformerConfig
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=case["world"])
    try:
        ps.initialize_model_parallel(
            tensor_model_parallel_size=case["tp"],
            pipeline_model_parallel_size=case["pp"],
            virtual_pipeline_model_parallel_size=case["vp"],
            context_parallel_size=case["cp"],
            expert_model_parallel_size=case["ep"],
            expert_tensor_parallel_size=case["etp"],
            create_gloo_process_groups=False,
            order="tp-cp-ep-pp-dp" if case.get("tp_pp_dp") else "tp-cp-ep-dp-pp",
        )
        cfg = TransformerConfig(
            num_layers=case["layers"],
            hidden_size=case["hidden"],
            num_attention_heads=case["heads"],
            num_query_groups=case["groups"],
            ffn_hidden_size=4 * case["hidden"],
            tensor_model_parallel_size=case["tp"],
            pipeline_model_parallel_size=case["pp"],
            virtual_pipeline_model_parallel_size=case["vp"],
            context_parallel_size=case["cp"],
            expert_model_parallel_size=case["ep"],
            expert_tensor_parallel_size=case["etp"],
            sequence_parallel=case["sp"],
            num_moe_experts=case["experts"],
            moe_router_topk=1 if case["experts"] else 2,
            moe_token_dispatcher_type="alltoall",
            moe_router_pre_softmax=True,
            num_layers_in_first_pipeline_stage=case["first"],
            num_layers_in_last_pipeline_stage=case["last"],
            account_for_embedding_in_pipeline_split=case["acc_emb"],
            account_for_loss_in_pipeline_split=case["acc_loss"],
            pipeline_model_parallel_layout=case.get("layout"),
            recompute_granularity=case["rg"],
            recompute_method=case["rm"],
            recompute_num_layers=case["rn"],
            bf16=case["bf16"],
            fp16=case["fp16"],
            params_dtype=torch.float32,
            pipeline_dtype=torch.float32,
            use_cpu_initialization=True,
            add_bias_linear=False,
            gradient_accumulation_fusion=False,
            bias_activation_fusion=False,
            masked_softmax_fusion=False,
            bias_dropout_fusion=False,
            apply_rope_fusion=False,
            persist_layer_norm=False,
        )
        if case["cp"] > 1:  # the local spec's attention has no CP (TE's has); CP was checked above
            import dataclasses

            cfg = dataclasses.replace(cfg, context_parallel_size=1)
        spec = get_gpt_layer_local_spec(num_experts=case["experts"])
        pp_rank = ps.get_pipeline_model_parallel_rank()
        chunks = cfg.virtual_pipeline_model_parallel_size or 1  # a layout sets it when VP is unset
        for vp_stage in range(chunks):
            pre = pp_rank == 0 and vp_stage == 0
            post = pp_rank == case["pp"] - 1 and vp_stage == chunks - 1
            model = GPTModel(
                cfg,
                spec,
                vocab_size=128,
                max_sequence_length=16,
                pre_process=pre,
                post_process=post,
                vp_stage=vp_stage if cfg.virtual_pipeline_model_parallel_size else None,
                position_embedding_type="rope",
            )
            _moe_forward(model, cfg)
        return None
    except Exception as e:  # Megatron-Core's refusal: the verdict this script reports
        return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:200]
    finally:
        ps.destroy_model_parallel()
        dist.destroy_process_group()


def _moe_forward(model, cfg) -> None:
    """One training-mode MoELayer.forward: Megatron-Core refuses MoE + TP > 1 without SP here."""
    import torch
    from megatron.core.transformer.moe.moe_layer import MoELayer

    moe = next((m for m in model.modules() if isinstance(m, MoELayer)), None)
    if moe is None or cfg.tensor_model_parallel_size == 1 or cfg.sequence_parallel:
        return  # no refusal possible past this point; routing on fake collectives proves nothing more
    moe.train()
    moe(torch.zeros(4, 1, cfg.hidden_size))


def verdict(case: dict) -> str | None:
    """``None`` when Megatron-Core accepts the case on every pipeline stage, else the first error."""
    mp = case["tp"] * case["cp"]
    dp = case["world"] // max(1, mp * case["pp"]) if case["world"] % max(1, mp * case["pp"]) == 0 else 1
    ranks = sorted({s * mp * dp for s in range(case["pp"])} | {0}) if case["world"] % (mp * case["pp"]) == 0 else [0]
    for r in ranks:
        if r >= case["world"]:
            break
        err = _try_rank(case, r)
        if err:
            return err
    return None


def main() -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    warnings.filterwarnings("ignore")
    import logging

    logging.disable(logging.WARNING)
    from kilocard.backends.cpu_shim import apply

    apply()  # CPU stand-ins for CUDA calls (streams, devices, torch norms under SP); no rule changes
    cases = json.load(sys.stdin)
    print(json.dumps([verdict(c) for c in cases]))


if __name__ == "__main__":
    main()
