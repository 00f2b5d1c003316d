"""The router rules against Megatron-Core itself, on random router settings: every setting Megatron-Core's
``TransformerConfig`` refuses, kilocard refuses before launch; every setting kilocard accepts builds and
routes random logits through Megatron-Core's own ``topk_routing_with_score_function``."""

from __future__ import annotations

import random
import warnings

import pytest

from kilocard.validate import validate
from run_configs import cfg_of

pytestmark = [pytest.mark.integration, pytest.mark.mcore_range]

ROUTER_CODES = {"MOE_ROUTER_SCORE", "MOE_ROUTER_GROUPS", "MOE_TOPK1_SOFTMAX", "MODEL_CHOICE", "MOE_TOPK"}


def random_router(rng: random.Random) -> dict[str, object]:
    experts = rng.choice([4, 6, 8, 16])
    groups = rng.choice([None, 1, 2, 3, 4, 8])
    return {
        "model.num_moe_experts": experts,
        "model.moe_router_topk": rng.choice([1, 2, 4, 8]),
        "model.moe_router_score_function": rng.choice(["softmax", "sigmoid"]),
        "model.moe_router_pre_softmax": rng.random() < 0.3,
        "model.moe_router_enable_expert_bias": rng.random() < 0.4,
        "model.moe_router_num_groups": groups,
        "model.moe_router_group_topk": rng.choice([None, 1, 2, 4]) if groups or rng.random() < 0.2 else None,
        "model.moe_router_topk_scaling_factor": rng.choice([None, 2.5]),
        "model.moe_router_dtype": rng.choice([None, "fp32"]),
    }


def mcore_refuses(values: dict[str, object]) -> bool:
    from megatron.core.transformer.transformer_config import TransformerConfig

    kw = {k.split(".", 1)[1]: v for k, v in values.items()}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            TransformerConfig(num_layers=2, hidden_size=64, num_attention_heads=4, **kw)
    except (ValueError, AssertionError):
        return True
    return False


def routes(values: dict[str, object]) -> None:
    """Megatron-Core's routing of 16 tokens under these settings (raises where it cannot)."""
    import torch
    from megatron.core.transformer.moe.moe_utils import topk_routing_with_score_function

    v = {k.split(".", 1)[1]: x for k, x in values.items()}
    experts = int(v["num_moe_experts"])
    probs, chosen = topk_routing_with_score_function(
        torch.randn(16, experts),
        int(v["moe_router_topk"]),
        use_pre_softmax=bool(v["moe_router_pre_softmax"]),
        num_groups=v["moe_router_num_groups"],
        group_topk=v["moe_router_group_topk"],
        scaling_factor=v["moe_router_topk_scaling_factor"],
        score_function=str(v["moe_router_score_function"]),
        expert_bias=torch.zeros(experts) if v["moe_router_enable_expert_bias"] else None,
    )
    assert (chosen.sum(dim=1) == int(v["moe_router_topk"])).all()


def test_random_router_settings_agree_with_megatron_core() -> None:
    rng = random.Random(39)
    refused = accepted = 0
    for _ in range(300):
        values = random_router(rng)
        ours = {i.code for i in validate(cfg_of(values)).errors} & ROUTER_CODES
        if mcore_refuses(values):
            assert ours, f"Megatron-Core refuses {values}, kilocard accepts it"
            refused += 1
        elif not ours:
            routes(values)
            accepted += 1
    assert refused > 20 and accepted > 20, (refused, accepted)
