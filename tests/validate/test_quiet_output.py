"""A warning or hint appears only where it applies: no warm-up warning for a short run of a recipe, no expert
hint for a dense model, a local run's fix is ``--nproc``, a bare recipe name gets ``did you mean recipe=``."""

from __future__ import annotations

from kilocard.api import compose, validate
from kilocard.commands import main


def codes(*overrides: str) -> dict[str, str]:
    """``{code: hint}`` of the issues of the composed config."""
    return {i.code: i.hint for i in validate(compose(*overrides)).issues}


def test_a_short_run_of_a_recipe_gets_no_warm_up_warning_but_a_decay_shorter_than_the_warm_up_does():
    assert "LR_WARMUP_CLAMPED" not in codes("recipe=llama3_8b", "trainer.train_iters=4")
    assert "LR_WARMUP_CLAMPED" not in codes("recipe=tiny_gpt", "trainer.train_iters=1", "optim.lr_warmup_iters=5")
    assert "LR_WARMUP_CLAMPED" in codes("recipe=tiny_gpt", "optim.lr_decay_iters=5", "optim.lr_warmup_iters=5")


def test_a_dense_model_gets_no_expert_hint_and_an_moe_model_keeps_it():
    dense = codes("recipe=llama3_70b", "parallel.tensor_model_parallel_size=3")
    assert "WORLD_NOT_DIVISIBLE" in dense and "EXPERT_WORLD_NOT_DIVISIBLE" not in dense
    moe = codes("recipe=tiny_moe", "cluster.gpus_per_node=4", "parallel.expert_model_parallel_size=3")
    assert "EXPERT_WORLD_NOT_DIVISIBLE" in moe


def test_a_local_run_is_told_more_local_ranks_and_a_slurm_run_more_nodes():
    local = codes("recipe=tiny_gpt", "parallel.tensor_model_parallel_size=2")["WORLD_NOT_DIVISIBLE"]
    assert local.startswith("kilocard run --nproc 2 ") and "cluster.nodes" not in local
    slurm = codes("recipe=llama3_70b", "parallel.tensor_model_parallel_size=3")["WORLD_NOT_DIVISIBLE"]
    assert "cluster.nodes to a multiple of 3" in slurm and "--nproc" not in slurm


def test_a_bare_recipe_name_gets_did_you_mean(capsys):
    assert main(["validate", "llama3_70b"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith("did you mean recipe=llama3_70b?)") and "EQUAL" not in err, err
    assert main(["show", "trainer.wandb"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("kilocard show: error: trainer.wandb: not an override") and "EQUAL" not in err, err
