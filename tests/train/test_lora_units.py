"""``kilocard.train.lora`` on one in-process CPU rank: the merge formula, Megatron-Bridge's init methods, the
adapted model at start (B zero: the base's own output), only adapters trainable, the forward equal to the
merged weights', the checkpoint's adapter part, and the fused-norm input of Transformer Engine's
LayerNorm-Linear (there a stand-in module: no Transformer Engine here)."""

from __future__ import annotations

import dataclasses
import math
import types

import pytest
import torch

from kilocard.config.schema import PeftConfig
from kilocard.train import lora

pytestmark = pytest.mark.integration  # imports torch and Megatron-Core


def test_merged_weight_is_base_plus_scaled_b_times_a() -> None:
    g = torch.Generator().manual_seed(0)
    w, a, b = (torch.randn(*s, generator=g) for s in ((12, 10), (4, 10), (12, 4)))
    torch.testing.assert_close(lora.merged_weight(w, a, b, alpha=8, dim=4), w + 2.0 * b @ a)
    half = lora.merged_weight(w.bfloat16(), a, b, alpha=8, dim=4)
    assert half.dtype == torch.bfloat16


def test_init_methods_are_megatron_bridges() -> None:
    t = torch.empty(64, 256)
    assert torch.count_nonzero(lora.init_method("zero")(t.clone())) == 0
    bound = 1 / math.sqrt(256)  # kaiming_uniform(a=sqrt(5)) on fan_in 256
    assert lora.init_method("kaiming")(t.clone()).abs().max() <= bound
    assert 0.15 < lora.init_method("normal")(t.clone()).std() < 0.25
    with pytest.raises(lora.LoraError, match="orthogonal"):
        lora.init_method("orthogonal")


def test_adapter_keys_split_a_state_dict() -> None:
    sd = {"decoder.layers.0.mlp.linear_fc1.weight": 1, "decoder.layers.0.mlp.linear_fc1.adapter.linear_in.weight": 2}
    assert list(lora.adapter_part(sd)) == ["decoder.layers.0.mlp.linear_fc1.adapter.linear_in.weight"]
    assert list(lora.base_part(sd)) == ["decoder.layers.0.mlp.linear_fc1.weight"]


def test_fused_layer_norm_input_is_normalised() -> None:
    """TE's LayerNorm-Linear holds the norm's weight; the adapter must see its output, not the raw input."""
    x, w = torch.randn(3, 2, 16), torch.rand(16) + 0.5
    rms = types.SimpleNamespace(layer_norm_weight=w, normalization="RMSNorm", eps=1e-5, zero_centered_gamma=False)
    expect = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * w
    torch.testing.assert_close(lora.adapter_input(rms, x), expect)
    centred = types.SimpleNamespace(**{**vars(rms), "zero_centered_gamma": True})
    torch.testing.assert_close(lora.adapter_input(centred, x), expect / w * (w + 1))
    plain = torch.nn.Linear(16, 4)
    assert lora.adapter_input(plain, x) is x


@pytest.fixture(scope="module")
def tiny_lora():
    """The tiny Llama with rank-4 adapters on every target, one CPU rank (Megatron-Core's parallel state)."""
    from kilocard.config.compose import compose, to_run_config
    from kilocard.convert import model as mm
    from kilocard.train import megatron_adapter as ma

    cfg = to_run_config(compose(["recipe=tiny_llama_sft", "peft=lora", "peft.dim=4", "peft.alpha=8"]))
    with mm.single_rank():
        ma.seed_all(0)
        base = mm.build(mm.single_rank_config(dataclasses.replace(cfg, peft=PeftConfig()), 384))
        with torch.no_grad():  # conversions build without initialising: give the base weights values
            for n, p in base.named_parameters():
                p.copy_(0.05 * torch.randn_like(p) + (1.0 if "norm" in n else 0.0))
        model = mm.build(mm.single_rank_config(cfg, 384))
        model.load_state_dict(lora.adapter_part(model.state_dict()) | base.state_dict())
        yield base, model


def _logits(model, tokens):
    s = tokens.shape[1]
    with torch.no_grad():
        return model(tokens, torch.arange(s).unsqueeze(0), torch.ones(1, 1, s, s, dtype=torch.bool).triu(1))


def test_adapted_model_starts_as_the_base_and_only_adapters_train(tiny_lora) -> None:
    base, model = tiny_lora
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert len(trainable) == 2 * 4 * 2 and all(".adapter.linear_" in n for n in trainable)
    tokens = torch.randint(0, 320, (1, 8))
    assert torch.equal(_logits(model, tokens), _logits(base, tokens))  # B starts at zero
    shapes = {n: tuple(p.shape) for n, p in model.named_parameters() if "layers.0." in n and p.requires_grad}
    assert shapes["decoder.layers.0.self_attention.linear_qkv.adapter.linear_in.weight"] == (4, 64)
    assert shapes["decoder.layers.0.self_attention.linear_qkv.adapter.linear_out.weight"] == (128, 4)
    assert shapes["decoder.layers.0.mlp.linear_fc1.adapter.linear_out.weight"] == (256, 4)  # gate and up rows
    assert shapes["decoder.layers.0.mlp.linear_fc2.adapter.linear_in.weight"] == (4, 128)


def test_forward_equals_the_merged_weights(tiny_lora) -> None:
    _, model = tiny_lora
    tokens = torch.randint(0, 320, (1, 8))
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith("adapter.linear_out.weight"):
                p.normal_(0.0, 0.1)
    adapted = _logits(model, tokens)
    sharded = model.sharded_state_dict()
    assert len(lora.adapter_part(sharded)) == 2 * 4 * 2 * 2  # A and B (and their extra states) per target
    assert "decoder.layers.0.mlp.linear_fc1.adapter.linear_out.weight" in sharded
    assert lora.merge(model) == 2 * 4  # the merged model computes what the adapted one did, the update once
    torch.testing.assert_close(_logits(model, tokens), adapted, rtol=0, atol=1e-5)


def test_unknown_target_is_one_line() -> None:
    with pytest.raises(lora.LoraError, match=r"peft.target_modules: \['q_proj'\] not among"):
        lora.apply(torch.nn.Linear(2, 2), PeftConfig(type="lora", target_modules=["q_proj"]), None, {})


def _lora_step_state(**peft: object):
    from kilocard.rundir import checkpoint as ck

    saved = {"type": "lora", "dim": 4, "target_modules": ["linear_qkv"], "base": "/nowhere", **peft}
    return ck.TrainerState(0, 0, {}, {}, {}, 384, extra={"peft": saved})


def test_a_lora_step_resumes_only_with_the_same_adapters(tmp_path) -> None:
    """The checkpoint manager's check before any tensor is read (called unbound on a stand-in: no ranks)."""
    from kilocard.config.schema import RunConfig
    from kilocard.rundir import checkpoint as ck
    from kilocard.train.ckpt_manager import CheckpointManager

    def manager(peft: PeftConfig) -> types.SimpleNamespace:
        return types.SimpleNamespace(lora=peft.type == "lora", cfg=dataclasses.replace(RunConfig(), peft=peft))

    state = _lora_step_state()
    with pytest.raises(ck.ModelMismatch, match="holds LoRA adapters only .* peft=lora"):
        CheckpointManager._peft_base(manager(PeftConfig()), tmp_path, state)  # type: ignore[arg-type]
    other = PeftConfig(type="lora", dim=8, target_modules=["linear_qkv"])
    with pytest.raises(ck.ModelMismatch, match=r"peft.dim: 4 -> 8"):
        CheckpointManager._peft_base(manager(other), tmp_path, state)  # type: ignore[arg-type]
    plain = dataclasses.replace(state, extra={})
    assert CheckpointManager._peft_base(manager(other), tmp_path, plain) is None  # type: ignore[arg-type]
    scaled = PeftConfig(type="lora", dim=4, alpha=64, target_modules=["linear_qkv"])  # alpha / dim: 16 -> 8
    with pytest.raises(ck.ModelMismatch, match=r"another shape or scale: peft.alpha: 32 -> 64"):
        CheckpointManager._peft_base(manager(scaled), tmp_path, _lora_step_state(alpha=32))  # type: ignore[arg-type]
    assert ck.peft_differences(state, scaled) == []  # a step from before alpha was recorded: not compared
