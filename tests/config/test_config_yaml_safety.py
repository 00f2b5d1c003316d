"""Recipe and config-group YAML is safe-loaded before Hydra reads it: a duplicate key, a
``!!python`` tag or an alias bomb is refused in one line naming the file and the line, quickly.

The end-to-end tests go through the real CLI and real Hydra composition; only the recipes folder
is a temporary one (``data_dir("recipes")`` pointed at ``tmp_path``, a seam, so no test writes into
the shipped ``recipes/`` folder): a good recipe there composes, a bad one is refused.
"""

from __future__ import annotations

import importlib
import time
from pathlib import Path

import pytest

from kilocard.commands import exits, main
from kilocard.config.explain import ComposeError
from kilocard.config.yamlcheck import MAX_VALUES, check_yaml_file
from kilocard.paths import data_dir

compose_mod = importlib.import_module("kilocard.config.compose")  # the package re-exports a function of that name

HEADER = "# @package _global_\ndefaults:\n  - override /model: tiny_gpt\n  - _self_\n"
BAD = {
    "duplicate": (
        HEADER + "trainer:\n  train_iters: 5\n  train_iters: 6\n",
        7,
        "duplicate key 'train_iters' (first at line 6)",
    ),
    "python_tag": (
        HEADER + 'trainer:\n  train_iters: !!python/object/apply:os.system ["touch /tmp/kilocard-pwned"]\n',
        6,
        "tag !!python/object/apply:os.system is not allowed",
    ),
    "alias_bomb": (
        "# @package _global_\n"
        "a: &a [x, x, x, x, x, x, x, x, x]\n"
        + "".join(f"{c}: &{c} [{', '.join([f'*{p}'] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi", strict=True)),
        7,  # where the expansion first passes the bound (9**6 values)
        f"aliases expand to more than {MAX_VALUES} values",
    ),
    "not_yaml": (HEADER + "trainer: [1, 2\n", 6, "not valid YAML"),
}


@pytest.mark.parametrize("kind", BAD)
def test_bad_file_is_refused_in_one_line_naming_file_and_line(kind, tmp_path):
    text, line, what = BAD[kind]
    path = tmp_path / f"{kind}.yaml"
    path.write_text(text)
    start = time.monotonic()
    with pytest.raises(ComposeError) as e:
        check_yaml_file(path)
    assert time.monotonic() - start < 5  # the bomb (9**9 values expanded) is bounded, not walked
    assert str(e.value).startswith(f"{path}:{line}: ") and what in str(e.value), str(e.value)
    assert "\n" not in str(e.value)


def test_every_shipped_file_passes():
    for path in [*data_dir("conf").rglob("*.yaml"), *data_dir("recipes").rglob("*.yaml")]:
        check_yaml_file(path)


def test_aliases_within_the_bound_are_fine(tmp_path):
    path = tmp_path / "ok.yaml"
    path.write_text("base: &b {lr: 0.1, wd: 0.01}\nx: *b\ny: *b\n<<: *b\n")
    check_yaml_file(path)


@pytest.fixture
def own_recipes(tmp_path, monkeypatch):
    """A site directory of the test's own (``KILOCARD_CONFIG_PATH``) whose recipes folder (family
    ``mine``) holds a good recipe ``fine``."""
    root = tmp_path / "recipes"
    (root / "mine").mkdir(parents=True)
    (root / "mine" / "fine.yaml").write_text(HEADER + "trainer:\n  train_iters: 7\n")
    monkeypatch.setenv("KILOCARD_CONFIG_PATH", str(tmp_path))
    yield root / "mine"


def test_a_good_recipe_in_the_folder_composes(own_recipes, capsys):
    assert main(["show", "recipe=fine", "-p", "trainer.train_iters"]) == exits.OK
    assert capsys.readouterr().out.strip() == "7"


@pytest.mark.parametrize("kind", ["duplicate", "python_tag", "alias_bomb"])
def test_cli_refuses_a_bad_recipe_in_one_line(kind, own_recipes, capsys):
    """Through ``kilocard show``/``validate``: exit 2, one line, no traceback, no hang, nothing executed.

    Before the check: a yaml traceback for the first two, and the bomb did not finish in 20 s."""
    text, line, what = BAD[kind]
    path = own_recipes / "evil.yaml"
    path.write_text(text)
    for verb in ("show", "validate"):
        rc = main([verb, "recipe=evil"])  # the bomb, unchecked, would hang here
        out, err = capsys.readouterr()
        assert rc == exits.USAGE and out == ""
        assert err.strip().splitlines() == [err.strip()] and f"{path}:{line}: {what}" in err, err
    assert not Path("/tmp/kilocard-pwned").exists()
