"""One ``Layout``: computed once, held by the launch plan and read by the step-time model."""

from __future__ import annotations

import json
from dataclasses import replace

from kilocard.config.compose import compose, to_run_config
from kilocard.layout import Layout, compute_layout
from kilocard.perf.flops import shape_from_model
from kilocard.perf.predict import features_of, hardware_for, step_time
from kilocard.perf.steptime import predict_step_time
from kilocard.plan import build_plan

PLAN_KEYS = {
    "nodes",
    "tasks_per_node",
    "world_size",
    "cpus_per_task",
    "gpus_per_node",
    "layout",
    "master_port",
    "env",
    "secret_env",
    "on_gpu",
}


def test_launch_plan_holds_the_layout_and_plan_json_keeps_its_keys():
    cfg = to_run_config(compose(["recipe=llama3_70b"]))
    lay = compute_layout(cfg)
    plan = build_plan(cfg, lay)
    assert plan.layout is lay and build_plan(cfg).layout == lay
    doc = json.loads(plan.to_json())
    assert set(doc) == PLAN_KEYS
    assert Layout.from_json(doc["layout"]) == lay, "plan.json holds the one form, read back whole"
    assert doc["world_size"] == lay.world_size and doc["nodes"] == lay.nodes


def test_enabled_flags_follow_the_degrees():
    lay = compute_layout(to_run_config(compose(["recipe=deepseek_v3"])))
    assert (lay.tp_enabled, lay.pp_enabled, lay.vp_enabled, lay.cp_enabled, lay.ep_enabled, lay.dp_enabled) == (
        lay.tp > 1,
        lay.pp > 1,
        lay.vp is not None,
        lay.cp > 1,
        lay.ep > 1,
        lay.dp > 1,
    )
    tiny = compute_layout(to_run_config(compose(["recipe=tiny_gpt", "cluster.gpus_per_node=1"])))
    assert not (tiny.tp_enabled or tiny.pp_enabled or tiny.vp_enabled or tiny.cp_enabled or tiny.dp_enabled)
    assert tiny.virtual_stages == 1


def test_step_time_reads_the_layouts_uneven_stage_layers():
    """DeepSeek-V3's 4 + 14 x 4 + 1 split: the slowest stage has 4 layers, not 61 / 16."""
    cfg = to_run_config(compose(["recipe=deepseek_v3"]))
    lay = compute_layout(cfg)
    assert lay.stage_layers is not None and len(set(lay.stage_layers)) > 1
    hw = hardware_for(cfg.cluster)
    shape = shape_from_model(cfg.model, lay.tp)
    even = replace(lay, stage_layers=None)  # what the model assumes without a split: layers / PP each
    uneven_s = predict_step_time(shape, lay, features_of(cfg), hw).total_s
    assert step_time(cfg, hw).total_s == uneven_s
    assert predict_step_time(shape, even, features_of(cfg), hw).total_s != uneven_s
