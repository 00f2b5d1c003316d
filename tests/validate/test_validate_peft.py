"""``peft=lora`` in validation and the performance model: the rules' one-line errors, and the Llama 3 SFT
recipes' memory, step time and checkpoint size with LoRA against without (pure: no torch)."""

from __future__ import annotations

import dataclasses

import pytest

from kilocard.config.compose import compose, to_run_config
from kilocard.config.schema import PeftConfig
from kilocard.layout import compute_layout
from kilocard.perf.memory import bytes_per_param, checkpoint_bytes, estimate_memory, lora_params
from kilocard.perf.params import count_parameters, lora_params_per_layer, lora_shapes
from kilocard.perf.predict import predict
from kilocard.validate import validate

LORA = PeftConfig(type="lora", dim=16, alpha=32)


def _lora(cfg, **changes):
    return dataclasses.replace(cfg, peft=dataclasses.replace(LORA, **changes))


@pytest.fixture(scope="module")
def sft8b():
    return to_run_config(compose(["recipe=llama3_8b_sft"]))


def test_peft_lora_composes_with_bridge_defaults() -> None:
    cfg = to_run_config(compose(["recipe=tiny_llama_sft", "peft=lora"]))
    p = cfg.peft
    assert (p.type, p.dim, p.alpha, p.dropout, p.dropout_position) == ("lora", 32, 32, 0.0, "pre")
    assert p.target_modules == ["linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"]
    assert (p.lora_A_init_method, p.lora_B_init_method) == ("xavier", "zero")
    assert to_run_config(compose(["recipe=tiny_llama_sft"])).peft.type is None


@pytest.mark.parametrize(
    "changes, code, field",
    [
        ({"target_modules": ["linear_qkv", "q_proj"]}, "LORA_TARGET", "peft.target_modules"),
        ({"target_modules": []}, "LORA_TARGET", "peft.target_modules"),
        ({"target_modules": ["linear_qkv", "linear_qkv"]}, "LORA_TARGET", "peft.target_modules"),  # one adapter each
        ({"dim": 0}, "LORA_DIM", "peft.dim"),
        ({"dim": 3}, "LORA_DIM", "peft.dim"),  # TP 2: A's rank rows are split over TP
        ({"alpha": 0}, "LORA_SETTING", "peft.alpha"),
        ({"dropout": 1.0}, "LORA_SETTING", "peft.dropout"),
        ({"dropout_position": "middle"}, "LORA_SETTING", "peft.dropout_position"),
        ({"lora_A_init_method": "orthogonal"}, "LORA_SETTING", "peft.lora_A_init_method"),
    ],
)
def test_bad_lora_settings_are_one_error_each(sft8b, changes, code, field) -> None:
    errors = validate(_lora(sft8b, **changes)).errors
    assert [(i.code, i.field) for i in errors] == [(code, field)]
    assert "\n" not in errors[0].message and errors[0].hint


def test_lora_without_base_weights_is_refused_as_megatron_bridge_does(sft8b) -> None:
    cfg = _lora(dataclasses.replace(sft8b, checkpoint=dataclasses.replace(sft8b.checkpoint, load=None)))
    assert [(i.code, i.field) for i in validate(cfg).errors] == [("PEFT_NO_BASE", "checkpoint.load")]


def test_lora_on_moe_is_refused() -> None:
    cfg = to_run_config(compose(["recipe=tiny_mixtral", "peft=lora", "checkpoint.load=/base"]))
    assert "LORA_MODEL" in {i.code for i in validate(cfg).errors}


def test_adapter_parameters_are_rank_times_in_plus_out() -> None:
    m = to_run_config(compose(["recipe=llama3_8b_sft"])).model
    shapes = lora_shapes(m)  # Llama 3 8B: hidden 4096, 32 heads of 128, 8 KV groups, ffn 14336, SwiGLU
    assert shapes == {
        "linear_qkv": (4096, 4096 + 2 * 1024),
        "linear_proj": (4096, 4096),
        "linear_fc1": (4096, 2 * 14336),
        "linear_fc2": (14336, 4096),
    }
    per_layer = lora_params_per_layer(m, 16, list(shapes))
    assert per_layer == 16 * (4096 + 6144 + 8192 + 4096 + 28672 + 14336 + 4096)
    assert lora_params_per_layer(m, 16, ["linear_qkv"]) == 16 * (4096 + 6144)


@pytest.mark.parametrize("name", ["llama3_8b_sft", "llama3_70b_sft"])
def test_lora_recipes_validate_with_a_smaller_memory_estimate(name: str) -> None:
    full = to_run_config(compose([f"recipe={name}"]))
    lora = to_run_config(compose([f"recipe={name}", "peft=lora"]))
    rf, rl = validate(full), validate(lora)
    assert rl.valid, [i.message for i in rl.errors]
    mf, ml = rf.estimates.memory, rl.estimates.memory
    assert mf is not None and ml is not None
    lay = compute_layout(lora)
    adapters = lora_params(lora, max(lay.stage_layers or [lora.model.num_layers])) / lay.tp
    bpp = bytes_per_param(lora)
    # the frozen base: its weights stay; gradients and optimizer state are the adapters' only
    assert ml.weights == pytest.approx(mf.weights + adapters * bpp.weight, abs=2)
    assert ml.gradients == pytest.approx(adapters * bpp.grad, abs=2)
    assert ml.optimizer == pytest.approx(adapters * bpp.optim / lay.dp_cp, abs=2)
    assert ml.activations == mf.activations
    assert ml.total < 0.5 * mf.total


@pytest.mark.parametrize("name", ["llama3_8b_sft", "llama3_70b_sft"])
def test_lora_step_is_faster_by_the_skipped_weight_gradients(name: str) -> None:
    full = to_run_config(compose([f"recipe={name}"]))
    lora = to_run_config(compose([f"recipe={name}", "peft=lora"]))
    pf, pl = predict(full), predict(lora)
    # the layers' GEMMs: 3 passes (forward, input and weight gradients) -> 2, plus the small adapters
    assert pl.breakdown["gemm"] < pf.breakdown["gemm"] * 2 / 3 * 1.05
    assert pl.breakdown["gemm"] > pf.breakdown["gemm"] * 2 / 3
    assert pl.breakdown["optimizer"] < pf.breakdown["optimizer"] / 50  # the adapters' state only
    assert pl.breakdown["attention"] == pf.breakdown["attention"]  # no weights there
    assert pl.step_time_s < pf.step_time_s


@pytest.mark.parametrize("name", ["llama3_8b_sft", "llama3_70b_sft"])
def test_a_lora_evaluation_costs_the_full_forward_plus_the_adapters(name: str) -> None:
    """Evaluation is forward only: freezing the base changes nothing there, so a LoRA run's evaluation is the full
    model's plus its adapters' GEMMs (none here: no target module), the output layer's share included."""
    full = to_run_config(compose([f"recipe={name}"]))
    no_adapters = _lora(full, target_modules=[])
    assert predict(full).eval_time_s > 0
    assert predict(no_adapters).eval_time_s == pytest.approx(predict(full).eval_time_s, rel=1e-12)
    assert predict(_lora(full)).eval_time_s > predict(full).eval_time_s  # the adapters' forward GEMMs


def test_plan_of_lora_targets_naming_no_module_says_so(capsys) -> None:
    """No adapter is trained: nothing to reduce over DP (the step-time model divided by the trained count) and
    ``kilocard plan`` names the rule, where it was an internal error (ZeroDivisionError)."""
    from kilocard.commands import main

    code = main(["plan", "recipe=llama3_8b_sft", "peft=lora", "peft.target_modules=[q_proj]"])
    out = capsys.readouterr()
    assert "internal error" not in out.err and code == 1, out.err  # the config refused, as validate refuses it
    assert "LORA_TARGET: peft.target_modules=['q_proj'] [0]='q_proj': is not one of" in out.out


def test_lora_checkpoint_holds_the_adapters_only(sft8b) -> None:
    lora = _lora(sft8b)
    bpp = bytes_per_param(lora)
    assert checkpoint_bytes(lora) == int(lora_params(lora) * (bpp.weight + bpp.optim))
    assert checkpoint_bytes(sft8b) == int(count_parameters(sft8b.model).total * (bpp.weight + bpp.optim))
    assert checkpoint_bytes(lora) < checkpoint_bytes(sft8b) / 100


def test_lora_settings_count_only_with_peft_lora(sft8b) -> None:
    """``peft.dim``/``peft.target_modules`` set but ``peft.type`` null (``peft=none`` with leftover overrides):
    memory, checkpoint size and step time are full training's, and so are the rules (values inside each field's
    domain: one outside it is refused whatever peft.type says, kilocard.config.domains)."""
    assert sft8b.peft.type is None
    leftover = _lora(sft8b, type=None, dim=3, target_modules=["linear_qkv"], alpha=7)
    assert estimate_memory(leftover) == estimate_memory(sft8b)
    assert checkpoint_bytes(leftover) == checkpoint_bytes(sft8b)
    assert predict(leftover).breakdown == predict(sft8b).breakdown
    assert validate(leftover).errors == validate(sft8b).errors == []
