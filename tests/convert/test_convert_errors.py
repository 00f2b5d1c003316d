"""Bad input to ``kilocard convert`` is refused with one line naming it, and nothing is written.

Refusals found before a model is built run in-process through the CLI; the dtype refusal, found while
the tensors stream, runs in a fresh interpreter as users run it.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from safetensors.torch import load_file, save_file
from tiny_hf import LLAMA31_ROPE, convert_all, hf_config, make

from kilocard import cli
from kilocard.config.schema import ModelConfig
from kilocard.convert import maps

pytestmark = pytest.mark.integration  # converts real checkpoints: torch, safetensors and transformers


def convert(capsys, *argv):
    """(exit code, stderr) of ``kilocard convert ARGV`` in this process."""
    capsys.readouterr()  # drop what making the model printed (transformers' progress bar)
    code = cli.main(["convert", *argv])
    return code, capsys.readouterr().err


def nothing_written(parent, out) -> bool:
    """Neither the output nor a staging sibling exists."""
    return not out.exists() and not list(parent.glob(f".{out.name}*"))


@pytest.fixture
def llama_single(tmp_path):
    """A tiny Llama saved as one model.safetensors (easy to edit)."""
    path = tmp_path / "hf"
    make("llama", path)
    tensors = {}
    for f in sorted(path.glob("*.safetensors")):
        tensors.update(load_file(str(f)))
        f.unlink()
    (path / "model.safetensors.index.json").unlink()
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    return path, tensors


def test_config_that_disagrees_with_the_recipe_names_every_field_at_once(tmp_path, capsys) -> None:
    make("llama", tmp_path / "hf", num_key_value_heads=4, intermediate_size=96, rms_norm_eps=1e-6)
    code, err = convert(capsys, "hf-to-mcore", str(tmp_path / "hf"), str(tmp_path / "out"), "recipe=tiny_llama")
    assert code == 1 and len(err.strip().splitlines()) == 1, err
    assert "config.json: num_key_value_heads is 4, recipe tiny_llama expects 2 (model.num_query_groups=2)" in err
    assert "rms_norm_eps is 1e-06, recipe tiny_llama expects 1e-05 (model.layernorm_epsilon=1e-05)" in err
    assert "intermediate_size is 96, recipe tiny_llama expects 128 (model.ffn_hidden_size=128)" in err
    assert err.rstrip().endswith(
        "without recipe= (the model then comes from config.json), or override those model fields"
    )
    assert nothing_written(tmp_path, tmp_path / "out")


def test_missing_and_unexpected_tensors_are_listed(llama_single, tmp_path, capsys) -> None:
    path, tensors = llama_single
    tensors.pop("model.layers.1.mlp.up_proj.weight")
    tensors.pop("model.norm.weight")
    tensors["model.layers.1.mlp.extra.weight"] = torch.zeros(2)
    save_file(tensors, str(path / "model.safetensors"))
    code, err = convert(capsys, "hf-to-mcore", str(path), str(tmp_path / "out"), "recipe=tiny_llama")
    assert code == 1 and len(err.strip().splitlines()) == 1, err
    assert "missing (2): model.layers.1.mlp.up_proj.weight, model.norm.weight" in err
    assert "unexpected (1): model.layers.1.mlp.extra.weight" in err
    assert nothing_written(tmp_path, tmp_path / "out")


def test_quantized_weights_are_refused(llama_single, tmp_path, capsys) -> None:
    path, tensors = llama_single
    tensors["model.layers.0.self_attn.q_proj.weight"] = tensors["model.layers.0.self_attn.q_proj.weight"].to(torch.int8)
    save_file(tensors, str(path / "model.safetensors"))
    code, err = convert(capsys, "hf-to-mcore", str(path), str(tmp_path / "out"), "recipe=tiny_llama")
    assert code == 1 and "model.layers.0.self_attn.q_proj.weight is I8" in err, err


def test_values_the_recipe_dtype_cannot_hold_are_refused_and_nothing_is_written(tmp_path) -> None:
    make("llama", tmp_path / "hf")  # float32 random weights do not fit bfloat16
    bf16 = make("llama", tmp_path / "hf_bf16", dtype=torch.bfloat16)
    codes = convert_all(
        ["hf-to-mcore", str(tmp_path / "hf"), str(tmp_path / "out"), "recipe=tiny_llama", "precision=bf16"],
        ["hf-to-mcore", str(tmp_path / "hf_bf16"), str(tmp_path / "ok"), "recipe=tiny_llama", "precision=bf16"],
    )
    assert codes == [1, 0]
    assert nothing_written(tmp_path, tmp_path / "out")
    assert (
        bf16.model.embed_tokens.weight.dtype == torch.bfloat16 and (tmp_path / "ok" / "latest_committed.txt").is_file()
    )


def test_unsupported_model_type_is_refused(llama_single, tmp_path, capsys) -> None:
    path, _ = llama_single
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "model_type": "gpt2"}))
    code, err = convert(capsys, "hf-to-mcore", str(path), str(tmp_path / "out"), "recipe=tiny_llama")
    assert code == 1 and "model_type 'gpt2' is not supported" in err, err


def test_an_existing_output_is_refused(llama_single, tmp_path, capsys) -> None:
    path, _ = llama_single
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "keep.txt").write_text("x")
    code, err = convert(capsys, "hf-to-mcore", str(path), str(tmp_path / "busy"), "recipe=tiny_llama")
    assert code == 2 and "already exists" in err, err  # input that cannot be used (commands/exits.py)
    assert (tmp_path / "busy" / "keep.txt").read_text() == "x"


def test_export_refuses_a_directory_that_is_no_checkpoint(tmp_path, capsys) -> None:
    code, err = convert(capsys, "mcore-to-hf", str(tmp_path), str(tmp_path / "out"))
    assert code == 2 and "neither a committed step directory" in err, err


def test_llama31_rope_scaling_is_checked_against_megatron_cores_constants() -> None:
    cfg = hf_config("llama31").to_dict()
    scaled = ModelConfig(**{**_model_yaml(), "rope_scaling": True})
    maps.check_config(cfg, "llama", scaled, "tiny_llama")
    with pytest.raises(
        maps.ConvertError,
        match=r"rope_type is 'llama3', recipe tiny_llama expects 'default' "
        r"\(model.rope_scaling=False\)",
    ):
        maps.check_config(cfg, "llama", ModelConfig(**_model_yaml()), "tiny_llama")
    other = hf_config("llama31", rope_parameters={**LLAMA31_ROPE, "low_freq_factor": 2.0}).to_dict()
    with pytest.raises(
        maps.ConvertError, match="rope_parameters.low_freq_factor is 2.0; kilocard's llama model needs 1.0"
    ):
        maps.check_config(other, "llama", scaled, "tiny_llama")


def test_a_recipe_model_the_family_cannot_hold_is_refused() -> None:
    with pytest.raises(maps.ConvertError, match="model.normalization: 'LayerNorm' has no llama"):
        maps.check_model("llama", ModelConfig(**{**_model_yaml(), "normalization": "LayerNorm"}))


def _model_yaml(name: str = "tiny_llama") -> dict:
    """The model file conf/model/NAME.yaml."""
    import yaml

    from kilocard.paths import data_dir

    return yaml.safe_load((data_dir("conf") / "model" / f"{name}.yaml").read_text())


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (["--max-shard-size", "lots"], "--max-shard-size: 'lots' is not a size"),
        (["model.num_layers=4"], "mcore-to-hf takes no overrides"),
    ],
)
def test_a_bad_flag_or_an_override_on_export_is_unusable_input(extra, says, tmp_path, capsys) -> None:
    """The exit-code table (``kilocard.commands.exits``): input that cannot be used is 2, like a bad flag of
    any verb; 1 is kept for a model the conversion refuses (the config and tensor checks above)."""
    code, err = convert(capsys, "mcore-to-hf", str(tmp_path), str(tmp_path / "out"), *extra)
    assert code == 2 and len(err.strip().splitlines()) == 1 and err.startswith("kilocard convert: error: ")
    assert says in err and nothing_written(tmp_path, tmp_path / "out")


@pytest.mark.parametrize("extra", [["--adapter-only"], ["--max-shard-size", "1GB"]])
def test_an_export_flag_on_import_is_unusable_input(extra, tmp_path, capsys) -> None:
    """``--adapter-only`` and ``--max-shard-size`` shape an export; on ``hf-to-mcore`` they would be ignored."""
    make("llama", tmp_path / "hf")
    code, err = convert(capsys, "hf-to-mcore", str(tmp_path / "hf"), str(tmp_path / "out"), *extra)
    assert code == 2 and len(err.strip().splitlines()) == 1 and err.startswith("kilocard convert: error: ")
    assert f"{extra[0]} is a mcore-to-hf flag" in err and nothing_written(tmp_path, tmp_path / "out")


def _tiny(name: str) -> ModelConfig:
    return ModelConfig(**_model_yaml(name))


def test_a_qwen3_moe_with_dense_layers_between_is_refused_by_name() -> None:
    m = _tiny("tiny_qwen3_moe")
    maps.check_config(hf_config("qwen3_moe").to_dict(), "qwen3_moe", m, "tiny_qwen3_moe")
    dense = hf_config("qwen3_moe", mlp_only_layers=[1]).to_dict()
    with pytest.raises(maps.ConvertError, match=r"mlp_only_layers is \[1\]; kilocard's qwen3_moe model needs \[\]"):
        maps.check_config(dense, "qwen3_moe", m, "tiny_qwen3_moe")
    with pytest.raises(maps.ConvertError, match=r"norm_topk_prob is False, recipe tiny_qwen3_moe expects True"):
        maps.check_config(hf_config("qwen3_moe", norm_topk_prob=False).to_dict(), "qwen3_moe", m, "tiny_qwen3_moe")


def test_a_qwen3_recipe_without_qk_layernorm_is_refused() -> None:
    with pytest.raises(maps.ConvertError, match="model.qk_layernorm: False has no qwen3 Hugging Face equivalent"):
        maps.check_model("qwen3", dataclasses.replace(_tiny("tiny_qwen3"), qk_layernorm=False))
