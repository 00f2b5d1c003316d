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
