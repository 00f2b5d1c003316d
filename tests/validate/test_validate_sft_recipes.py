"""The Llama 3 fine-tuning recipes validate on their H100 profiles: layout, memory and the SFT data rules."""

from __future__ import annotations

import pytest

from kilocard.config.compose import compose, to_run_config
from kilocard.validate import validate


@pytest.mark.parametrize(
    "name, nodes, tp, pp",
    [("llama3_8b_sft", 1, 2, 1), ("llama3_70b_sft", 4, 4, 4)],
)
def test_llama3_sft_recipes_validate_on_h100(name: str, nodes: int, tp: int, pp: int) -> None:
    cfg = to_run_config(compose([f"recipe={name}"]))
    report = validate(cfg)
    assert report.valid, [i.message for i in report.errors]
    assert not {"MEMORY_TIGHT", "OUT_OF_MEMORY"} & {i.code for i in report.issues}
    assert (cfg.cluster.nodes, cfg.parallel.tensor_model_parallel_size, cfg.parallel.pipeline_model_parallel_size) == (
        nodes,
        tp,
        pp,
    )
    assert cfg.data.sft and cfg.data.type == "indexed" and cfg.trainer.eval_interval
    assert cfg.data.tokenizer.endswith("-Instruct")  # the tokenizer whose chat template renders the data
    mock = to_run_config(compose([f"recipe={name}", "data.type=mock"]))
    assert [i.code for i in validate(mock).errors] == ["SFT_LOSS_MASK"]  # SFT needs conversations


@pytest.mark.parametrize("name, experts_per_rank", [("deepseek_v3_sft", 4), ("kimi_k2_sft", 6)])
def test_moe_sft_recipes_validate_on_h100_with_nemo_full_sft_layout(name: str, experts_per_rank: int) -> None:
    """DeepSeek-V3 and Kimi-K2 chat SFT: NeMo 2.0's full DeepSeek-V3 fine-tuning layout (64 nodes, TP1 PP8 EP64, 6
    layers first and 7 last), no MTP, from an imported checkpoint; it fits in memory and fills its pipeline."""
    cfg = to_run_config(compose([f"recipe={name}"]))
    report = validate(cfg)
    assert report.valid, [i.message for i in report.errors]
    assert not {"MEMORY_TIGHT", "OUT_OF_MEMORY", "PIPELINE_BUBBLE"} & {i.code for i in report.issues}
    p = cfg.parallel
    assert (cfg.cluster.nodes, p.tensor_model_parallel_size, p.pipeline_model_parallel_size) == (64, 1, 8)
    assert cfg.model.num_moe_experts // p.expert_model_parallel_size == experts_per_rank
    assert (p.num_layers_in_first_pipeline_stage, p.num_layers_in_last_pipeline_stage) == (6, 7)
    assert cfg.data.sft and cfg.data.type == "indexed" and cfg.checkpoint.load and cfg.model.mtp_num_layers is None
    assert cfg.model.rope_type == "yarn"  # the Hugging Face checkpoint's YaRN, which the import compares
    mock = to_run_config(compose([f"recipe={name}", "data.type=mock"]))
    assert [i.code for i in validate(mock).errors] == ["SFT_LOSS_MASK"]


@pytest.mark.parametrize("name", ["deepseek_v3_sft", "kimi_k2_sft"])
def test_moe_sft_recipes_pass_kilocard_validate_with_real_paths(name: str, tmp_path, capsys) -> None:
    """``kilocard validate`` with the paths on disk: the shipped chat set and its tokenizer, and a committed step
    of this recipe's model (as ``convert hf-to-mcore ... recipe=NAME`` writes it; the weights are not read)."""
    import dataclasses
    import json

    from kilocard.cli import main
    from kilocard.layout import compute_layout, of_sizes
    from kilocard.perf.params import padded_vocab_size
    from kilocard.rundir import checkpoint as ck
    from kilocard.rundir.names import MODEL_ONLY, STATE

    cfg = to_run_config(compose([f"recipe={name}"]))
    root = tmp_path / "ck"
    sdir = ck.step_dir(root, 0)
    sdir.mkdir(parents=True)
    padded = padded_vocab_size(cfg.model, compute_layout(cfg).tp)
    state = ck.TrainerState(
        step=0,
        consumed_samples=0,
        scheduler={},
        model=dataclasses.asdict(cfg.model),
        layout=of_sizes(1).to_json(),
        padded_vocab_size=padded,
        extra={MODEL_ONLY: True},
    )
    (sdir / STATE).write_text(json.dumps(dataclasses.asdict(state)))
    assert ck.read_state(sdir) == state
    ck.commit_step(root, 0, keep_last=1)
    paths = ["data.data_path=[data/tiny_chat/tiny_chat_text_document]", "data.tokenizer=data/tiny_chat"]
    paths += [f"checkpoint.load={root}", f"cluster.shared_fs={tmp_path}"]
    capsys.readouterr()
    assert main(["validate", f"recipe={name}", *paths]) == 0
    out = capsys.readouterr()
    assert "ERROR" not in out.out + out.err
    wrong = main(["validate", f"recipe={name}", *paths, "model.rotary_scaling_factor=8.0"])  # not YaRN's 40 or 32
    assert wrong == 1 and "CHECKPOINT_MODEL_MISMATCH" in capsys.readouterr().out
