"""``parallel.pipeline_model_parallel_layout``: parsed as Megatron-Core parses it, split per rank, checked."""

from __future__ import annotations

import pytest

from kilocard.layout import compute_layout, layout_stage_layers, parse_pipeline_layout
from kilocard.validate.parallel import layout_problem
from run_configs import cfg_of


def test_parse_unrolls_groups_and_repeats_like_megatron_core():
    # the example of Megatron-Core's parse_str_to_list docstring: "Ettt|(tt|)*29,m|L"
    stages = parse_pipeline_layout("Ettt|(tt|)*29,m|L")
    assert stages == ["Ettt"] + ["tt"] * 29 + ["m", "L"]
    assert parse_pipeline_layout("Et*4|(t*4|)*14tL") == ["Etttt"] + ["tttt"] * 14 + ["tL"]
    assert parse_pipeline_layout("Ex|L") is None
    assert parse_pipeline_layout("(t*999999|)*999999L") is None  # refused before it is expanded


def test_stage_k_runs_on_rank_k_mod_pp():
    # DeepSeek-V3's Megatron-Bridge layout for PP4 VP4: rank 0 holds chunks 0, 4, 8, 12 (E+4, 4, 4, 4)
    assert layout_stage_layers("Et*4|(t*4|)*14tL", 4) == [16, 16, 16, 13]
    assert layout_stage_layers("Et*4|(t*4|)*14tL", 16) == [4] * 15 + [1]
    assert layout_stage_layers("Et*4|(t*4|)*14tL", 3) is None


def test_layout_fixes_stage_layers_and_the_virtual_stages():
    cfg = cfg_of(
        {
            "model.num_layers": 61,
            "cluster.gpus_per_node": 4,
            "parallel.pipeline_model_parallel_size": 4,
            "parallel.pipeline_model_parallel_layout": "Et*4|(t*4|)*14tL",
        }
    )
    lay = compute_layout(cfg)
    assert lay.stage_layers == [16, 16, 16, 13]
    assert lay.vp == 4  # Megatron-Core takes the layout's when VP is unset


@pytest.mark.parametrize(
    "text,pp,vp,layers,mtp,words",
    [
        ("Ett|tt|tt|tL", 4, None, 6, None, "places 7 transformer layers"),
        ("Ex|L", 1, None, 0, None, "does not parse"),
        ("Et*9999999L", 1, None, 9999999, None, "at most 1048576 letters"),
        ("Ett|tt|tL", 4, None, 5, None, "not a multiple of pp(4)"),
        ("Et|t|t|tL", 2, 4, 4, None, "2 virtual stages per pipeline rank"),
        ("tt|EtL", 2, None, 3, None, "start with the embedding"),
        ("Et|tmL", 2, None, 2, None, "places 1 MTP layers"),
        ("Em|ttL", 2, None, 2, 1, "before the MTP layers"),
        ("Et|tm|L|", 2, None, 2, 1, "last virtual stage"),
    ],
)
def test_layout_problems_name_what_megatron_core_refuses(text, pp, vp, layers, mtp, words):
    assert words in (layout_problem(text, pp, vp, layers, mtp) or "")


def test_a_layout_megatron_core_accepts_has_no_problem():
    assert layout_problem("Et*4|(t*4|)*14tmL", 16, None, 61, 1) is None
    assert layout_problem("Et|(tt|)*30mL", 8, 4, 61, 1) is None
