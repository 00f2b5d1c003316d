"""LoRA adapters on Megatron-Core's parallel linear layers (``peft=lora``), the base weights frozen.

Semantics and names are Megatron-Bridge's (``megatron/bridge/peft/lora.py``, ``utils.py``
``ParallelLinearAdapter``): a target module ``linear_qkv``, ``linear_proj``, ``linear_fc1`` or
``linear_fc2`` computes ``W x + (alpha / dim) * B A x``; A (``linear_in``) starts ``xavier`` (or
``kaiming``, ``normal``, ``zero``), B (``linear_out``) ``zero``, so the adapted model starts as the base.
Sharding follows the base layer, as Bridge's adapter does:

* column-parallel base (``linear_qkv``, ``linear_fc1``: output split over TP): A is a
  ``ColumnParallelLinear(in, dim, gather_output=True)`` (its ``dim`` rows split over TP, the low-rank
  activation gathered), B a ``ColumnParallelLinear(dim, out)`` whose rows split like the base's output;
  with sequence parallelism the input is gathered over the sequence first;
* row-parallel base (``linear_proj``, ``linear_fc2``: input split over TP): A is a
  ``RowParallelLinear(in, dim, input_is_parallel=True)`` (its columns split, the partial sums
  all-reduced), B a ``ColumnParallelLinear(dim, out, gather_output=True)``; with sequence parallelism
  the output is scattered over the sequence like the base's.

Why not Bridge's own classes: Megatron-Bridge 0.3.1's ``peft/lora.py`` and ``lora_layers.py`` import
``transformer_engine`` unconditionally, so they cannot be imported on CPU ranks (or any machine without
Transformer Engine), and ``LoRALinear`` wraps the base in a ``to_wrap`` child, renaming the base's
parameters in ``state_dict``. Here the adapter is a child ``adapter`` of the base linear itself (the
base keeps its names: a base checkpoint loads unchanged), added to the base's output by a forward hook.

On Transformer Engine's layer spec ``linear_qkv`` and ``linear_fc1`` fuse the layer norm in front of their
GEMM; the adapter then takes the normalised input (``adapter_input``), as Bridge's ``LoRALinear`` takes
the LayerNorm-Linear's ``layernorm_output``.

Checkpoints hold the adapters only (``adapter_part``): the base is read from ``checkpoint.load`` (see
``kilocard.train.ckpt_manager``); ``merge`` folds ``(alpha / dim) * B @ A`` into the base weight for export.
"""

from __future__ import annotations

import copy
import math
import types
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from kilocard.config.schema import LORA_INIT_METHODS, LORA_TARGETS, PeftConfig

COLUMN_PARALLEL = ("linear_qkv", "linear_fc1")
"""Target modules whose base splits its output over TP ranks (the others split their input)."""
ADAPTER = "adapter"
"""Name of the adapter child module under its base linear (state-dict keys ``...linear_qkv.adapter.*``)."""


class LoraError(Exception):
    """A LoRA setting kilocard cannot build (one line naming the field, the value and the fix)."""


def init_method(name: str) -> Callable[[torch.Tensor], Any]:
    """Megatron-Bridge's ``ParallelLinearAdapter._get_init_fn`` for ``name``."""
    if name == "xavier":
        return nn.init.xavier_normal_
    if name == "kaiming":
        return lambda t: nn.init.kaiming_uniform_(t, a=math.sqrt(5))
    if name == "normal":
        return lambda t: nn.init.normal_(t, mean=0.0, std=0.2)
    if name == "zero":
        return nn.init.zeros_
    raise LoraError(f"peft init method: {name!r} is not one of {', '.join(LORA_INIT_METHODS)}")


def scale(peft: PeftConfig) -> float:
    """``alpha / dim``: what the adapter's output is multiplied by."""
    return peft.alpha / peft.dim


def merged_weight(weight: torch.Tensor, a: torch.Tensor, b: torch.Tensor, alpha: float, dim: int) -> torch.Tensor:
    """``W + (alpha / dim) * B @ A`` computed in fp32, in ``W``'s dtype (whole, unsharded tensors)."""
    delta = (alpha / dim) * (b.float() @ a.float())
    return (weight.float() + delta).to(weight.dtype)


class LoraAdapter(nn.Module):
    """The low-rank path of one target module: ``(alpha / dim) * B(A(dropout(x)))`` (Bridge's
    ``ParallelLinearAdapter`` with ``activation="identity"``, no norm, no expert or all-to-all paths)."""

    def __init__(self, target: str, in_features: int, out_features: int, peft: PeftConfig, config: Any) -> None:
        super().__init__()
        from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear

        self.target, self.dim, self.alpha = target, peft.dim, peft.alpha
        self.dropout_position = peft.dropout_position
        self.input_is_parallel = target not in COLUMN_PARALLEL
        self.sequence_parallel = bool(config.sequence_parallel)
        own = copy.copy(config)  # the adapter's linears do no sequence-parallel communication themselves
        own.sequence_parallel = False
        own.perform_initialization = True
        a_init, b_init = init_method(peft.lora_A_init_method), init_method(peft.lora_B_init_method)
        self.linear_in: Any
        self.linear_out: Any
        if self.input_is_parallel:
            self.linear_in = RowParallelLinear(
                in_features,
                peft.dim,
                config=own,
                init_method=a_init,
                bias=False,
                input_is_parallel=True,
                skip_bias_add=True,
            )
        else:
            self.linear_in = ColumnParallelLinear(
                in_features,
                peft.dim,
                config=own,
                init_method=a_init,
                bias=False,
                gather_output=True,
                disable_grad_reduce=self.sequence_parallel,
            )
        self.linear_out = ColumnParallelLinear(
            peft.dim, out_features, config=own, init_method=b_init, bias=False, gather_output=self.input_is_parallel
        )
        self.dropout: nn.Module = nn.Dropout(peft.dropout) if peft.dropout > 0 else nn.Identity()
        self.swiglu = target == "linear_fc1" and bool(config.gated_linear_unit)
        """B of a gated fc1 holds, per TP rank, its share of the gate rows then of the up rows (as the base)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from megatron.core.tensor_parallel.mappings import (
            gather_from_sequence_parallel_region,
            scatter_to_sequence_parallel_region,
        )

        if self.dropout_position == "pre":
            x = self.dropout(x)
        if self.sequence_parallel and not self.input_is_parallel:
            x = gather_from_sequence_parallel_region(x)
        x, _ = self.linear_in(x)
        x, _ = self.linear_out(x)
        if self.sequence_parallel and self.input_is_parallel:
            x = scatter_to_sequence_parallel_region(x)
        if self.dropout_position == "post":
            x = self.dropout(x)
        return x * (self.alpha / self.dim)

    def sharded_state_dict(self, prefix: str = "", sharded_offsets: tuple = (), metadata: dict | None = None) -> dict:
        """A and B as ``megatron.core.dist_checkpointing`` tensors, resharded on load like the base's."""
        from megatron.core.transformer.mlp import apply_swiglu_sharded_factory

        sd = dict(self.linear_in.sharded_state_dict(f"{prefix}linear_in.", sharded_offsets, metadata))
        out = self.linear_out.sharded_state_dict(f"{prefix}linear_out.", sharded_offsets, metadata)
        if self.swiglu:
            key = f"{prefix}linear_out.weight"
            out[key] = apply_swiglu_sharded_factory(out[key], sharded_offsets)
        sd.update(out)
        return sd


def _add_adapter(module: nn.Module, args: tuple, kwargs: dict, output: Any) -> Any:
    """Forward hook of a wrapped linear: its ``(output, bias)`` with the adapter's path added to the output."""
    x = args[0] if args else kwargs["input_"]
    out, bias = output
    return out + getattr(module, ADAPTER)(adapter_input(module, x)), bias


def _sharded_state_dict(self: nn.Module, prefix: str = "", sharded_offsets: tuple = (), metadata: Any = None) -> dict:
    """The base linear's own sharded state dict (its class's), the adapter's tensors sharded as the adapter says."""
    own = f"{prefix}{ADAPTER}."
    cls: Any = type(self)
    sd = cls.sharded_state_dict(self, prefix, sharded_offsets, metadata)
    sd = {k: v for k, v in sd.items() if not k.startswith(own)}
    sd.update(getattr(self, ADAPTER).sharded_state_dict(own, sharded_offsets, metadata))
    return sd


def targets_in(model: nn.Module, targets: list[str]) -> Iterator[tuple[str, nn.Module]]:
    """``(qualified name, module)`` of every linear of ``model``'s transformer layers named in ``targets``."""
    for name, module in model.named_modules():
        leaf = name.rsplit(".", 1)[-1]
        if leaf in targets and ".layers." in f".{name}" and not hasattr(module, ADAPTER):
            yield name, module


def check_module(name: str, module: nn.Module) -> None:
    """Refuse a target kilocard's adapter does not cover: an MoE expert's linear (Bridge's expert paths)."""
    if ".experts." in f".{name}." or getattr(module, "is_expert", False):
        raise LoraError(f"peft.target_modules: {name} is an MoE expert; kilocard's LoRA adapts dense layers only")


def adapter_input(module: Any, x: torch.Tensor) -> torch.Tensor:
    """What the base's GEMM multiplies: ``x`` itself, or ``x`` through the layer norm that Transformer Engine's
    LayerNorm-Linear (``linear_qkv``, ``linear_fc1`` of the TE layer spec) fuses in front of it."""
    w = getattr(module, "layer_norm_weight", None)
    if w is None:
        return x
    if getattr(module, "zero_centered_gamma", False):
        w = w + 1
    shape = (x.shape[-1],)
    if getattr(module, "normalization", "LayerNorm") == "RMSNorm":
        return torch.nn.functional.rms_norm(x, shape, w, module.eps)
    return torch.nn.functional.layer_norm(x, shape, w, getattr(module, "layer_norm_bias", None), module.eps)


def apply(model: nn.Module, peft: PeftConfig, config: Any, shapes: dict[str, tuple[int, int]]) -> int:
    """Freeze every parameter of ``model`` and attach a trainable adapter to each target module; returns how many.

    ``shapes`` is ``kilocard.perf.params.lora_shapes`` of the model (whole in/out features per target).
    """
    unknown = [t for t in peft.target_modules if t not in LORA_TARGETS]
    if unknown:
        raise LoraError(f"peft.target_modules: {unknown} not among {list(LORA_TARGETS)}")
    for p in model.parameters():
        p.requires_grad_(False)
    found = list(targets_in(model, list(peft.target_modules)))
    for name, module in found:
        check_module(name, module)
        target = name.rsplit(".", 1)[-1]
        adapter = LoraAdapter(target, *shapes[target], peft, config)
        dev = next(module.parameters()).device
        module.add_module(ADAPTER, adapter.to(dev))
        module.register_forward_hook(_add_adapter, with_kwargs=True)
        module.__dict__["sharded_state_dict"] = types.MethodType(_sharded_state_dict, module)
    return len(found)


def is_adapter_key(key: str) -> bool:
    """Whether a (sharded) state-dict key belongs to an adapter."""
    return f".{ADAPTER}." in f".{key}"


def adapter_part(sd: dict[str, Any]) -> dict[str, Any]:
    """The adapters' entries of a model state dict (what a LoRA step saves)."""
    return {k: v for k, v in sd.items() if is_adapter_key(k)}


def base_part(sd: dict[str, Any]) -> dict[str, Any]:
    """Every entry of a model state dict but the adapters' (what the base checkpoint holds)."""
    return {k: v for k, v in sd.items() if not is_adapter_key(k)}


@torch.no_grad()
def merge(model: nn.Module) -> int:
    """Fold each adapter into its base weight (whole tensors: a single-rank model) and zero its B, so that the
    module computes the merged weight alone (the adapter stays attached: adding its update again would count it
    twice); returns how many."""
    n = 0
    for _name, module in list(model.named_modules()):
        adapter = getattr(module, ADAPTER, None)
        if not isinstance(adapter, LoraAdapter):
            continue
        w: Any = module.weight
        w.copy_(merged_weight(w, adapter.linear_in.weight, adapter.linear_out.weight, adapter.alpha, adapter.dim))
        adapter.linear_out.weight.zero_()
        n += 1
    return n
