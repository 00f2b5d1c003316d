"""LoRA steps on export: the adapters' config and base, and the adapter alone in the PEFT library's format.

A LoRA step (``peft=lora``) holds the adapters only; its trainer state names the base step
(``names.PEFT``). ``mcore-to-hf`` merges ``W + (alpha / dim) * B @ A`` into the base
(``kilocard.train.lora.merge``) or, with ``--adapter-only``, writes what
``peft.PeftModel.from_pretrained(base, OUT)`` loads: ``adapter_config.json`` and
``adapter_model.safetensors`` with PEFT's names, ``base_model.model.<HF module>.lora_A.weight`` (``r x in``)
and ``.lora_B.weight`` (``out x r``). Megatron-Core's fused ``linear_qkv`` and gated ``linear_fc1`` become
``q_proj``/``k_proj``/``v_proj`` and ``gate_proj``/``up_proj``: each gets the shared A and its own rows of B
(``maps.region``), which is the same update, since the rows of ``B @ A`` are the rows of B times A.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import torch

from kilocard.config.schema import ModelConfig, PeftConfig
from kilocard.convert import maps
from kilocard.convert.maps import ConvertUsageError
from kilocard.rundir import checkpoint as ck
from kilocard.rundir.names import PEFT

ADAPTER_CONFIG = "adapter_config.json"
"""The PEFT library's adapter config file."""
ADAPTER_WEIGHTS = "adapter_model.safetensors"
"""The PEFT library's adapter weights file."""
PEFT_PREFIX = "base_model.model."
"""What ``PeftModel`` puts in front of the base model's own module names."""


def lora_of(state: ck.TrainerState, sdir: Path) -> tuple[PeftConfig | None, Path | None]:
    """``(peft config, base step directory)`` of a LoRA step, the base verified; ``(None, None)`` for any other."""
    saved = state.extra.get(PEFT)
    if saved is None:
        return None, None
    known = {f.name for f in dataclasses.fields(PeftConfig)}
    peft = PeftConfig(**{k: v for k, v in saved.items() if k in known})
    try:
        base = ck.lora_base(state, sdir)
    except ck.CheckpointError as e:
        raise ConvertUsageError(
            f"{sdir} holds LoRA adapters whose base weights cannot be used: {e} (the run's checkpoint.load)"
        ) from None
    return peft, base


def adapter_tensors(sd: dict[str, torch.Tensor], m: ModelConfig, peft: PeftConfig, family: str) -> dict[str, Any]:
    """PEFT's tensors of the adapters in the single-rank state dict ``sd``, by PEFT's names."""
    out: dict[str, torch.Tensor] = {}
    for s in maps.slots(family, m):
        target = s.mcore.rsplit(".", 2)[-2]
        if not s.mcore.endswith(".weight") or target not in peft.target_modules:
            continue
        if s.experts:  # one Hugging Face tensor holds every expert: PEFT has no adapter name for one of them
            raise ConvertUsageError(
                f"--adapter-only: {s.hf} holds all {s.experts} experts in one tensor, PEFT has no "
                f"adapter for one expert's part; export the merged model (without --adapter-only)"
            )
        prefix = s.mcore.removesuffix("weight") + "adapter."
        name = PEFT_PREFIX + s.hf.removesuffix(".weight")
        out[f"{name}.lora_A.weight"] = sd[prefix + "linear_in.weight"]  # shared: cloned below
        out[f"{name}.lora_B.weight"] = maps.region(sd[prefix + "linear_out.weight"], s, m).reshape(-1, peft.dim)
    return {k: v.contiguous().clone() for k, v in out.items()}


def adapter_config(peft: PeftConfig, names: list[str], base_model: str | None) -> dict[str, Any]:
    """``adapter_config.json`` for the tensors ``names``: rank, alpha, dropout and the HF modules they adapt."""
    modules = sorted({n.rsplit(".", 3)[-3] for n in names})  # ...self_attn.q_proj.lora_A.weight -> q_proj
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model,
        "r": peft.dim,
        "lora_alpha": peft.alpha,
        "lora_dropout": peft.dropout,
        "target_modules": modules,
        "bias": "none",
        "fan_in_fan_out": False,
        "use_rslora": False,
        "use_dora": False,
        "init_lora_weights": True,
        "modules_to_save": None,
        "inference_mode": True,
    }


def base_source(base: Path) -> str | None:
    """The Hugging Face directory the base step was imported from, if it was (``hf-to-mcore`` records it)."""
    try:
        source = ck.read_state(base).extra.get("source") or {}
    except ck.CheckpointError:
        return None
    return source.get("dir") if isinstance(source.get("dir"), str) else None


def write_adapter(
    out: Path, sd: dict[str, torch.Tensor], m: ModelConfig, peft: PeftConfig, family: str, base: Path
) -> None:
    """Write ``adapter_config.json`` and ``adapter_model.safetensors`` into ``out``."""
    from kilocard.convert.st_io import save_tensors

    tensors = adapter_tensors(sd, m, peft, family)
    save_tensors(tensors, out / ADAPTER_WEIGHTS)
    config = adapter_config(peft, list(tensors), base_source(base))
    (out / ADAPTER_CONFIG).write_text(json.dumps(config, indent=2) + "\n")
