"""The single-rank Megatron-Core model a conversion fills or reads, and its torch_dist checkpoint.

Conversions run in one process on CPU: a gloo group of one rank, Megatron-Core's parallel state at
TP1/PP1/EP1, and the trainer's own model builder (``train.megatron_adapter``), so the tensors are
exactly the ones a training run saves and loads. The weights are allocated but not initialised
(every one is overwritten); ``megatron.core.dist_checkpointing`` reshards them on load onto any layout.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from kilocard.config.schema import ModelConfig, ParallelConfig, PeftConfig, RunConfig
from kilocard.convert.spec import ConvertError


@contextlib.contextmanager
def single_rank() -> Iterator[None]:
    """A one-rank gloo group and Megatron-Core parallel state (TP=PP=EP=1) on CPU, torn down after."""
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    from kilocard.backends import cpu

    cpu()  # the CPU shim, before any Megatron-Core model is built
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)  # one rank: no port to race for
    try:
        ps.initialize_model_parallel(1, 1)
        yield
    finally:
        ps.destroy_model_parallel()
        dist.destroy_process_group()


MTP_LAYER = (".mtp_model_layer.", ".transformer_layer.")
"""An MTP layer's decoder layer: megatron-core 0.19's name, and 0.16's, which the family maps use."""


def tensors(model: Any, keep_vars: bool = False) -> dict[str, Any]:
    """``model``'s state dict (no ``_extra_state``) under the names the family maps use (``MTP_LAYER``)."""
    old, new = MTP_LAYER
    sd = model.state_dict(keep_vars=keep_vars)
    return {k.replace(old, new, 1): v for k, v in sd.items() if not k.endswith("_extra_state")}


def single_rank_config(run_cfg: RunConfig, padded_vocab: int) -> RunConfig:
    """``run_cfg`` on one CPU rank: no parallelism, no FP8, the vocabulary padded to ``padded_vocab`` rows."""
    # padded_vocab_size(m, tp=1) rounds up to make_vocab_size_divisible_by: this keeps the recipe's padding.
    model = dataclasses.replace(run_cfg.model, make_vocab_size_divisible_by=padded_vocab)
    precision = dataclasses.replace(run_cfg.precision, fp8=None, fp8_param=False, fp4=None)
    return dataclasses.replace(run_cfg, model=model, parallel=ParallelConfig(), precision=precision)


def build(run_cfg: RunConfig) -> Any:
    """The GPTModel of ``run_cfg`` (a ``single_rank_config``) with uninitialised weights (and, with ``peft=lora``,
    its adapters), in eval mode."""
    from kilocard.backends import Backend
    from kilocard.train import megatron_adapter as ma

    backend = Backend(name="cpu", dist_backend="gloo", local_spec=True)
    try:
        config = ma.transformer_config(run_cfg, backend)
    except ma.UnsupportedConfig as e:  # what the installed megatron-core cannot build as the family's layout
        raise ConvertError(str(e)) from None
    config.perform_initialization = False
    (model,) = ma.build_model_chunks(run_cfg, config, backend)
    ma.apply_peft(run_cfg, config, [model])
    return model.eval()


def run_config_for(m: ModelConfig, dtype: torch.dtype, peft: PeftConfig | None = None) -> RunConfig:
    """A ``RunConfig`` holding model ``m`` with parameters of ``dtype`` (and LoRA adapters ``peft``) for export,
    where no recipe is given."""
    base = RunConfig()
    name = {torch.bfloat16: "bfloat16", torch.float16: "float16"}.get(dtype, "float32")
    precision = dataclasses.replace(
        base.precision, bf16=dtype == torch.bfloat16, fp16=dtype == torch.float16, params_dtype=name
    )
    return dataclasses.replace(base, model=m, precision=precision, peft=peft or base.peft)


def save(model: Any, step_dir: Path) -> None:
    """Write the model's sharded state dict as torch_dist under ``step_dir`` (the trainer's ``model`` key)."""
    from megatron.core import dist_checkpointing

    step_dir.mkdir(parents=True)
    dist_checkpointing.save({"model": model.sharded_state_dict()}, str(step_dir))


def load(model: Any, step_dir: Path, part: Callable[[dict[str, Any]], dict[str, Any]] | None = None) -> None:
    """Load the model weights of a torch_dist step into ``model`` (optimizer state, if any, is left on disk); with
    ``part`` (``kilocard.train.lora.base_part`` / ``adapter_part``) exactly that part of them."""
    from megatron.core import dist_checkpointing

    sd = model.sharded_state_dict()
    loaded = dist_checkpointing.load({"model": part(sd) if part else sd}, str(step_dir))
    if part is None:
        model.load_state_dict(loaded["model"], strict=True)
        return
    result = model.load_state_dict(loaded["model"], strict=False)
    missing = set(part(model.state_dict())) & set(result.missing_keys)
    if missing or result.unexpected_keys:  # a kilocard bug, not bad input: the keys come from the same model
        raise RuntimeError(f"{step_dir}: missing {sorted(missing)[:5]}, unexpected {result.unexpected_keys[:5]}")


def saved_dtype(step_dir: Path) -> torch.dtype:
    """The dtype the step's word embedding was saved in (the model's parameter dtype)."""
    from megatron.core import dist_checkpointing

    meta = dist_checkpointing.load_tensors_metadata(str(step_dir))
    return meta["embedding.word_embeddings.weight"].dtype
