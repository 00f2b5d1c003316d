"""Hydra's override grammar works on kilocard configs exactly as Hydra documents it.

Every test composes through Hydra's public compose API (``kilocard.config.compose``) or the
``kilocard show`` verb in-process; nothing is mocked.
"""

from __future__ import annotations

import yaml

from kilocard.commands import main
from kilocard.commands.exits import OK as EXIT_OK
from kilocard.config.compose import compose, compose_many, to_run_config


def run(*overrides: str):
    return to_run_config(compose(list(overrides)))


def test_set_a_field_with_dotted_key() -> None:
    rc = run("recipe=llama3_8b", "trainer.global_batch_size=1024", "model.seq_length=4096")
    assert (rc.trainer.global_batch_size, rc.model.seq_length, rc.model.name) == (1024, 4096, "llama3_8b")


def test_values_take_yaml_types_lists_and_null() -> None:
    rc = run("recipe=tiny_moe", "model.moe_layer_freq=[0,1,1,1]", "model.ffn_hidden_size=null", "optim.lr=1e-4")
    assert list(rc.model.moe_layer_freq) == [0, 1, 1, 1]
    assert rc.model.ffn_hidden_size is None
    assert rc.optim.lr == 1e-4


def test_append_to_a_free_form_map_with_plus() -> None:
    rc = run("recipe=llama3_8b", "+cluster.env.NCCL_DEBUG=INFO")
    assert rc.cluster.env == {"NCCL_DEBUG": "INFO"}


def test_delete_with_tilde_a_map_entry_and_a_group() -> None:
    rc = run(
        "recipe=llama3_8b", "+cluster.env.NCCL_DEBUG=INFO", "+cluster.env.NCCL_IB_HCA=mlx5", "~cluster.env.NCCL_DEBUG"
    )
    assert rc.cluster.env == {"NCCL_IB_HCA": "mlx5"}
    # deleting a group's selection leaves the schema's defaults for that group
    rc = run("recipe=llama3_8b", "~launcher")
    assert rc.launcher.kind == "local"


def test_select_a_group_option_over_the_recipe_choice() -> None:
    rc = run("recipe=llama3_70b", "precision=fp8", "cluster=h200_dgx")
    assert (rc.precision.fp8, rc.precision.fp8_recipe, rc.precision.bf16) == ("hybrid", "tensorwise", True)
    # the recipe's own values still apply on top of the chosen cluster profile
    assert (rc.cluster.gpu, rc.cluster.nodes, rc.cluster.name) == ("h200-sxm-141gb", 64, "h200_dgx")


def test_multirun_sweep_composes_the_cartesian_product() -> None:
    points = compose_many(["recipe=tiny_gpt", "trainer.global_batch_size=8,16", "precision=fp32,bf16"], multirun=True)
    got = sorted((to_run_config(cfg).trainer.global_batch_size, to_run_config(cfg).precision.bf16) for _, cfg in points)
    assert got == [(8, False), (8, True), (16, False), (16, True)]
    assert all(combo[0] == "recipe=tiny_gpt" for combo, _ in points)


def test_show_multirun_prints_one_config_per_point(capsys) -> None:
    assert main(["show", "-m", "recipe=tiny_gpt", "trainer.micro_batch_size=1,2,4", "-p", "trainer"]) == EXIT_OK
    out = capsys.readouterr().out
    headers = [line for line in out.splitlines() if line.startswith("# overrides:")]
    assert headers == [f"# overrides: recipe=tiny_gpt trainer.micro_batch_size={n}" for n in (1, 2, 4)]
    assert out.count("micro_batch_size:") == 3


def test_show_cfg_job_prints_the_config_without_hydra(capsys) -> None:
    assert main(["show", "--cfg", "job", "recipe=llama3_70b"]) == EXIT_OK
    printed = yaml.safe_load(capsys.readouterr().out)
    assert "hydra" not in printed
    assert printed["model"]["num_layers"] == 80 and printed["recipe"]["name"] == "llama3_70b"


def test_show_cfg_hydra_prints_only_hydra(capsys) -> None:
    assert main(["show", "--cfg", "hydra", "recipe=tiny_gpt"]) == EXIT_OK
    printed = yaml.safe_load(capsys.readouterr().out)
    assert list(printed) == ["hydra"]
    assert "recipes=tiny/tiny_gpt" in printed["hydra"]["overrides"]["task"]


def test_show_package_prints_one_node_or_one_field(capsys) -> None:
    assert main(["show", "recipe=deepseek_v3", "-p", "parallel"]) == EXIT_OK
    parallel = yaml.safe_load(capsys.readouterr().out)
    assert parallel["expert_model_parallel_size"] == 64 and "model" not in parallel
    assert main(["show", "recipe=deepseek_v3", "--package", "model.hidden_size"]) == EXIT_OK
    assert capsys.readouterr().out.strip() == "7168"
