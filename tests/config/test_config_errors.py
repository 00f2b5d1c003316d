"""Bad input to ``kilocard show`` fails with exit code 2 and one line naming field, value, expectation.

The four mistakes users make most (a misspelt key, a wrong type, a missing recipe, a missing group
option) run the real console command in a subprocess; the rest call ``kilocard.cli.main`` in-process,
which is the same code path minus interpreter start-up.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kilocard.commands import main
from kilocard.commands.exits import USAGE as EXIT_USAGE


def kilocard_command() -> list[str]:
    """The installed ``kilocard`` console script next to this interpreter (``python -m`` otherwise)."""
    script = Path(sys.executable).parent / "kilocard"
    return [str(script)] if script.exists() else [sys.executable, "-m", "kilocard.cli"]


def run_show(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "TMPDIR": str(tmp_path), "OMP_NUM_THREADS": "1"}
    return subprocess.run([*kilocard_command(), "show", *args], env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.integration  # runs the kilocard console script
@pytest.mark.parametrize(
    "args, must_contain",
    [
        # misspelt key: the field, the value given, the closest real field
        (
            ["recipe=llama3_70b", "trainer.globl_batch_size=256"],
            ["trainer.globl_batch_size", "'256'", "global_batch_size"],
        ),
        # wrong type: the field, the value, what the field takes
        (["trainer.global_batch_size=abc"], ["trainer.global_batch_size", "'abc'", "whole number"]),
        # missing recipe: the name given and the closest recipe names
        (["recipe=lama3_70b"], ["recipe", "'lama3_70b'", "llama3_70b", "kilocard recipes"]),
        # missing option of a config group: the group, the option, the options there are
        (["recipe=llama3_8b", "cluster=h100"], ["cluster", "'h100'", "h100_dgx", "a100_dgx"]),
    ],
    ids=["misspelt-key", "wrong-type", "missing-recipe", "missing-group-option"],
)
def test_console_errors_are_one_clear_line(args: list[str], must_contain: list[str], tmp_path: Path) -> None:
    proc = run_show(args, tmp_path)
    assert proc.returncode == EXIT_USAGE, proc.stderr
    assert proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert lines[0].startswith("kilocard show: error: ")
    for text in must_contain:
        assert text in lines[0], (text, lines[0])


@pytest.mark.parametrize(
    "args, must_contain",
    [
        (["cluster.nodes=1.5"], ["cluster.nodes", "'1.5'", "whole number"]),
        (["precision.bf16=maybe"], ["precision.bf16", "'maybe'", "true or false"]),
        (["trainer.train_iters=null"], ["trainer.train_iters", "cannot be null", "whole number"]),
        (["model.name=[1,2]"], ["model.name", "'[1,2]'", "text"]),
        (["cluster.env=5"], ["cluster.env", "'5'", "map"]),
        (["+model.fo=1"], ["model.fo", "unknown field", "'1'"]),
        (["foo=bar"], ["foo", "unknown field", "'bar'", "model", "parallel"]),
        (["cluster.env.NCCL_DEBUG=INFO"], ["cluster.env.NCCL_DEBUG", "+cluster.env.NCCL_DEBUG=INFO"]),
        (["~model.ffn_hidden_size"], ["~model.ffn_hidden_size", "cannot be deleted", "model.ffn_hidden_size=null"]),
        (["~cluster.env.NOT_SET"], ["~cluster.env.NOT_SET", "nothing to delete"]),
        (["model.moe_layer_freq=[1,2"], ["model.moe_layer_freq", "cannot parse", "key=value"]),
        (["trainer.global_batch_size=128,256"], ["trainer.global_batch_size", "'128,256'", "--multirun"]),
        (["recipe=tiny_gpt", "-p", "model.nope"], ["model.nope", "--package", "model.hidden_size"]),
    ],
)
def test_other_mistakes_name_field_value_and_expectation(args: list[str], must_contain: list[str], capsys) -> None:
    assert main(["show", *args]) == EXIT_USAGE
    out, err = capsys.readouterr()
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    for text in must_contain:
        assert text in lines[0], (text, lines[0])


def test_a_broken_recipe_is_named_in_the_catalog_error(tmp_path: Path, monkeypatch) -> None:
    """A recipe file with a bad value fails the catalog with the recipe's name, the field and the value.

    The shipped data folder is pointed at a temporary copy holding the broken recipe (real Hydra)."""
    import importlib

    from kilocard import paths
    from kilocard.recipes import compose_recipes

    compose = importlib.import_module("kilocard.config.compose")
    searchpath = importlib.import_module("kilocard.config.searchpath")

    shutil_copy(paths.data_dir("conf"), tmp_path / "conf")
    (tmp_path / "recipes" / "tiny").mkdir(parents=True)
    (tmp_path / "recipes" / "tiny" / "broken.yaml").write_text(
        "# @package _global_\nrecipe: {name: broken, family: tiny}\ntrainer: {global_batch_size: lots}\n"
    )
    monkeypatch.setattr(paths, "_PKG", tmp_path)
    searchpath.shipped_recipes.cache_clear()
    try:
        with pytest.raises(
            compose.ComposeError, match=r"recipe broken: trainer.global_batch_size: .*'lots'.*recipes/tiny/broken.yaml"
        ):
            compose_recipes(["broken"])
    finally:
        searchpath.shipped_recipes.cache_clear()


def shutil_copy(src: Path, dst: Path) -> None:
    import shutil

    shutil.copytree(src, dst)
