"""What a checkpoint step holds on each rank besides the trainer state: the sharded model and
optimizer state dict for ``megatron.core.dist_checkpointing``, and every RNG of the rank."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

OPTIM_SHARDING = "fully_reshardable"
"""DistributedOptimizer sharding type: reloadable onto any TP/PP/DP layout."""


def rng_state() -> dict[str, Any]:
    """Every RNG of this rank: python, numpy, torch, CUDA, and Megatron's model-parallel tracker."""
    from megatron.core.tensor_parallel.random import get_cuda_rng_tracker

    return {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state() if torch.cuda.is_available() else None,
        "tracker": get_cuda_rng_tracker().get_states(),
    }


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what ``rng_state`` captured."""
    from megatron.core.tensor_parallel.random import get_cuda_rng_tracker

    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if state["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
    get_cuda_rng_tracker().set_states(state["tracker"])


def rng_file(sdir: Path, rank: int) -> Path:
    """Per-rank RNG file of a step."""
    return sdir / "rng" / f"rank_{rank:05d}.pt"


Part = Callable[[dict[str, Any]], dict[str, Any]]
"""A filter of a chunk's state dict (``kilocard.train.lora.adapter_part``, ``base_part``)."""


def model_sharded_state_dict(model: list[Any], part: Part | None = None) -> dict[str, Any]:
    """Model chunks only: ``model``, or ``model0``, ``model1``.. with virtual stages; ``part`` of each when given."""
    keep = part or (lambda sd: sd)
    meta = chunk_metadata(model)
    if len(model) == 1:
        return {"model": keep(model[0].module.sharded_state_dict(metadata=meta))}
    return {f"model{i}": keep(m.module.sharded_state_dict(metadata=meta)) for i, m in enumerate(model)}


def chunk_metadata(model: list[Any]) -> dict[str, Any] | None:
    """The ``metadata`` a chunk's sharded state dict needs: a multi-token-prediction block on a stage without
    the embedding keeps a copy of the embedding, tied over the data-parallel group that Megatron-LM names
    in it (``dp_cp_group``); ``None`` (Megatron-Core's default) otherwise."""
    if not any(getattr(m.module, "mtp_process", False) for m in model):
        return None
    from megatron.core import parallel_state as ps

    return {"dp_cp_group": ps.get_data_parallel_group(with_context_parallel=True)}


def sharded_state_dict(model: list[Any], optimizer: Any, is_loading: bool, part: Part | None = None) -> dict[str, Any]:
    """Model chunks (``model_sharded_state_dict``, ``part`` of them) and the optimizer."""
    sd = model_sharded_state_dict(model, part)
    sd["optimizer"] = optimizer.sharded_state_dict(
        sd, is_loading=is_loading, metadata={"distrib_optim_sharding_type": OPTIM_SHARDING}
    )
    return sd


def unsaved_moments_dropped(sd: dict[str, Any], sdir: Path) -> dict[str, Any]:
    """``sd`` (a load request) without the optimizer moments that step ``sdir`` does not hold because its optimizer
    had not stepped yet: under fp16 the dynamic loss scale skips the first steps (their gradients overflow), and
    a save among them holds the weights and fp32 main copies but no Adam moments. The optimizer then loads as
    it was saved, fresh. A step holding some of the requested moments is left to the load to refuse."""
    from megatron.core.dist_checkpointing import load_tensors_metadata
    from megatron.core.dist_checkpointing.mapping import ShardedTensor

    saved = set(load_tensors_metadata(str(sdir)))

    def keys(value: Any) -> list[str]:
        if isinstance(value, ShardedTensor):
            return [value.key]
        items = value.values() if isinstance(value, dict) else value if isinstance(value, list | tuple) else []
        return [k for v in items for k in keys(v)]

    def visit(value: Any) -> None:
        if isinstance(value, dict):
            if "state" in value and "param_groups" in value:
                wanted = keys(value["state"])
                if wanted and not saved.intersection(wanted):
                    value["state"] = {}
            for v in value.values():
                visit(v)
        elif isinstance(value, list):
            for v in value:
                visit(v)

    visit(sd.get("optimizer"))
    return sd


def init_optimizer_states(optimizer: Any) -> None:
    """Materialise empty torch-Adam states (a zero-grad step; params unchanged) before building a load dict."""
    for o in getattr(optimizer, "chained_optimizers", [optimizer]):
        if hasattr(o, "_init_optimizer_states_with_dummy_values"):
            o._init_optimizer_states_with_dummy_values()
        else:
            inner = o.optimizer
            for g in inner.param_groups:
                for p in g["params"]:
                    if p.grad is None:
                        p.grad = torch.zeros_like(p)
            saved_lr = [g["lr"] for g in inner.param_groups]
            for g in inner.param_groups:
                g["lr"] = 0.0
            if not inner.state:
                wds = [g.get("weight_decay", 0.0) for g in inner.param_groups]
                for g in inner.param_groups:
                    g["weight_decay"] = 0.0
                inner.step()
                for g, wd in zip(inner.param_groups, wds, strict=False):
                    g["weight_decay"] = wd
            for g, lr in zip(inner.param_groups, saved_lr, strict=False):
                g["lr"] = lr
