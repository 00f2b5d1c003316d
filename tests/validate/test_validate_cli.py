"""``kilocard validate`` as a user runs it: real Hydra composition, text and JSON, exit codes."""

from __future__ import annotations

import json

from kilocard.cli import main


def test_valid_config_prints_layout_memory_and_exits_0(capsys):
    assert main(["validate", "recipe=tiny_moe"]) == 0
    out = capsys.readouterr().out
    assert "layout: world 1 = 1 nodes x 1 GPUs" in out and "micro-batches per step" in out
    assert "weights" in out and "activations" in out and "HBM" in out and "no problems found" in out


def test_invalid_config_prints_every_problem_and_exits_1(capsys):
    rc = main(
        [
            "validate",
            "recipe=tiny_moe",
            "cluster.gpus_per_node=4",
            "launcher.nproc=4",
            "parallel.tensor_model_parallel_size=3",
            "parallel.expert_model_parallel_size=3",
            "precision.fp8=hybrid",
        ]
    )
    out = capsys.readouterr().out
    assert rc == 1
    for code in ("WORLD_NOT_DIVISIBLE", "EXPERT_WORLD_NOT_DIVISIBLE", "TP_HEADS", "EXPERTS_EP", "GPU_ONLY_ON_CPU"):
        assert code in out, code
    assert "tp(3) * pp(1) * cp(1) = 3 does not divide world size 1 nodes * 4 GPUs = 4" in out
    assert "fix:" in out


def test_json_is_one_stable_object(capsys):
    rc = main(
        [
            "validate",
            "recipe=tiny_gpt",
            "cluster.gpus_per_node=2",
            "launcher.nproc=2",
            "parallel.tensor_model_parallel_size=2",
            "parallel.sequence_parallel=false",
            "--format",
            "json",
        ]
    )
    d = json.loads(capsys.readouterr().out)
    assert rc == 0 and d["valid"] is True
    assert set(d) == {"valid", "issues", "layout", "estimates"}
    for k in (
        "world_size",
        "tp",
        "pp",
        "vp",
        "cp",
        "ep",
        "etp",
        "dp",
        "expert_dp",
        "num_microbatches",
        "nodes",
        "gpus_per_node",
    ):
        assert k in d["layout"], k
    mem = d["estimates"]["memory_bytes_per_gpu"]
    assert set(mem) == {"weights", "gradients", "optimizer", "activations", "total"}
    assert mem["total"] == sum(mem[k] for k in ("weights", "gradients", "optimizer", "activations"))
    assert isinstance(d["estimates"]["hbm_bytes"], int) and d["estimates"]["flops_convention"] == "megatron_current"
    assert d["estimates"]["flops_per_iteration"] > 0


def test_json_issue_fields(capsys):
    assert main(["validate", "recipe=tiny_gpt", "parallel.sequence_parallel=true", "--format", "json"]) == 1
    (issue,) = json.loads(capsys.readouterr().out)["issues"]
    assert issue == {
        "severity": "error",
        "code": "SP_WITHOUT_TP",
        "field": "parallel.sequence_parallel",
        "value": True,
        "message": issue["message"],
        "hint": issue["hint"],
    }


def test_sweep_validates_every_point(capsys):
    rc = main(
        ["validate", "recipe=tiny_gpt", "parallel.tensor_model_parallel_size=1,3", "--multirun", "--format", "json"]
    )
    d = json.loads(capsys.readouterr().out)
    assert rc == 1 and [x["valid"] for x in d] == [True, False]


def test_uncomposable_config_exits_2(capsys):
    assert main(["validate", "recipe=tiny_gpt", "parallel.tensor_modl_parallel_size=2"]) == 2
    assert "did you mean" in capsys.readouterr().err


def test_validate_states_the_model_error_under_the_prediction(capsys):
    """The prediction comes with the model's held-out error on published rows like the run (text and JSON)."""
    assert main(["validate", "recipe=llama3_70b"]) == 0
    text = capsys.readouterr().out
    below = text[text.index("predicted: ") :].splitlines()[1:3]
    assert below[0].strip().startswith("model error on published rows, each predicted by a fit that never saw")
    assert "sources like this run (hopper, dense, 16-bit): mean " in below[1] and "90% within" in below[1]
    assert main(["validate", "recipe=mixtral_8x7b", "--format", "json"]) == 0
    estimates = json.loads(capsys.readouterr().out)["estimates"]
    band = estimates["model_error"]
    assert band["traits"][1] == "MoE" and band["rows"] >= 5 and 0 < band["cv_mean_abs_rel_error"] < 0.5
    assert estimates["model_error_issue"] is None


def test_validate_says_when_the_recipes_published_row_is_not_scored(capsys):
    """A recipe whose published row the model is known to miss (kept out of the scoring with its reason) says so
    under the prediction, in text and JSON; a recipe of a scored row does not."""
    from kilocard.calibration.baselines import load_rows

    excluded = {r.id: r.excluded for r in load_rows() if r.excluded}
    rid = "bridge2511-gb200-gptoss-120b-bf16"
    assert rid in excluded
    assert main(["validate", "recipe=bridge2511_gb200_gptoss_120b_bf16", "--skip-path-checks"]) == 0
    text = capsys.readouterr().out
    assert f"  the published row {rid} is not scored: {excluded[rid]}" in text.splitlines()
    argv = ["validate", "recipe=bridge2511_gb200_gptoss_120b_bf16", "--skip-path-checks", "--format", "json"]
    assert main(argv) == 0
    assert json.loads(capsys.readouterr().out)["estimates"]["baseline_unscored"].endswith(excluded[rid])
    assert main(["validate", "recipe=mlm_h100_32b", "--skip-path-checks"]) == 0
    assert "is not scored" not in capsys.readouterr().out
