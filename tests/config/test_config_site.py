"""Site configuration outside the package: ``KILOCARD_CONFIG_PATH``, ``hydra.searchpath``, recipes by path.

Every test composes with real Hydra against a site directory made in ``tmp_path``, holding the
cluster profile and the recipe that docs/recipes.md's "Site configuration" section shows (read from
that page, so the documented files are the tested ones; tests/docs runs its commands). The CLI tests
run the real console command.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from kilocard.config.compose import ComposeError, compose, recipe_catalog, to_run_config
from kilocard.paths import data_dir

SITE_CLUSTER = "mysite_h100"
SITE_RECIPE = "mysite_llama3_8b"


def readme_site_files() -> dict[str, str]:
    """The YAML blocks of docs/recipes.md's site section, keyed by the site-relative path each one names
    (the page names them under ``site/``, the directory its commands use)."""
    readme = (data_dir("conf").parent / "docs" / "recipes.md").read_text()
    section = readme[readme.index("## Site configuration") :]
    section = section[: section.index("\n## ", 1)]
    files = {}
    for block in re.findall(r"```yaml\n(.*?)```", section, re.S):
        files[re.search(r"^# site/(\S+\.yaml)", block, re.M).group(1)] = block
    return files


def write_site(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


@pytest.fixture
def site(tmp_path: Path) -> Path:
    """A site directory holding the documented cluster profile and recipe."""
    return write_site(tmp_path / "site", readme_site_files())


def test_docs_show_a_site_profile_and_a_recipe() -> None:
    assert set(readme_site_files()) == {f"cluster/{SITE_CLUSTER}.yaml", f"recipes/mysite/{SITE_RECIPE}.yaml"}


def test_env_var_adds_site_cluster_and_recipe(site: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KILOCARD_CONFIG_PATH", f"{site}{os.pathsep}")  # an empty entry is ignored
    rc = to_run_config(compose([f"recipe={SITE_RECIPE}"]))
    assert (rc.cluster.name, rc.cluster.partition, rc.cluster.account) == (SITE_CLUSTER, "gpu", "llm-pretrain")
    assert rc.cluster.container_mounts == ["/lustre:/lustre", "/scratch:/scratch"]
    assert rc.cluster.env["NCCL_SOCKET_IFNAME"] == "ib0"
    assert (rc.recipe.family, rc.model.name, rc.cluster.nodes, rc.trainer.global_batch_size) == (
        "mysite",
        "llama3_8b",
        2,
        256,
    )
    assert recipe_catalog()[SITE_RECIPE] == site / "recipes" / "mysite" / f"{SITE_RECIPE}.yaml"
    # a shipped recipe on the site's profile, and the shipped recipes stay where they were
    assert to_run_config(compose(["recipe=llama3_70b", f"cluster={SITE_CLUSTER}"])).cluster.partition == "gpu"
    assert "llama3_70b" in recipe_catalog()


def test_two_site_dirs_in_search_order(site: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    other = write_site(tmp_path / "other", {"precision/site_bf16.yaml": "bf16: true\n"})
    monkeypatch.setenv("KILOCARD_CONFIG_PATH", f"{site}{os.pathsep}{other}")
    rc = to_run_config(compose([f"recipe={SITE_RECIPE}", "precision=site_bf16"]))
    assert (rc.cluster.name, rc.precision.bf16) == (SITE_CLUSTER, True)


@pytest.mark.parametrize("form", ["plain", "file", "relative"])
def test_hydra_searchpath_override(form: str, site: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KILOCARD_CONFIG_PATH", raising=False)
    monkeypatch.chdir(site.parent)
    entry = {"plain": str(site), "file": f"file://{site}", "relative": site.name}[form]
    rc = to_run_config(compose([f"hydra.searchpath=[{entry}]", f"recipe={SITE_RECIPE}"]))
    assert rc.cluster.name == SITE_CLUSTER


def test_site_options_are_suggested(site: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KILOCARD_CONFIG_PATH", str(site))
    with pytest.raises(ComposeError, match=r"cluster: no such option .*mysite_h100.*did you mean 'mysite_h100'"):
        compose(["cluster=mysite_h10"])


def test_recipe_by_path(site: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A recipe file given by path needs no search path entry for itself (its cluster still must be found)."""
    monkeypatch.setenv("KILOCARD_CONFIG_PATH", str(site))
    mine = site.parent / "my_recipe.yaml"
    mine.write_text((site / "recipes" / "mysite" / f"{SITE_RECIPE}.yaml").read_text().replace("256", "128"))
    monkeypatch.chdir(site.parent)
    rc = to_run_config(compose(["recipe=./my_recipe.yaml", "cluster.nodes=4"]))
    assert (rc.recipe.name, rc.trainer.global_batch_size, rc.cluster.nodes) == (SITE_RECIPE, 128, 4)
    assert to_run_config(compose([f"recipe={mine}"])).trainer.global_batch_size == 128


def test_recipe_by_path_errors_name_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KILOCARD_CONFIG_PATH", raising=False)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ComposeError, match=r"recipe: no such recipe file \(got './absent.yaml'"):
        compose(["recipe=./absent.yaml"])
    (tmp_path / "bad.yaml").write_text("# @package _global_\ntrainer: {global_batch_size: lots}\n")
    with pytest.raises(ComposeError, match=r"trainer.global_batch_size: .*'lots'.*set by recipe .*bad.yaml"):
        compose(["recipe=bad.yaml"])


def test_site_cluster_colliding_with_shipped_names_both_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    shipped = data_dir("conf") / "cluster" / "h100_dgx.yaml"
    site = write_site(tmp_path / "site", {"cluster/h100_dgx.yaml": shipped.read_text()})
    monkeypatch.setenv("KILOCARD_CONFIG_PATH", str(site))
    with pytest.raises(ComposeError) as err:
        compose([])
    assert str(shipped) in str(err.value) and str(site / "cluster" / "h100_dgx.yaml") in str(err.value)
    assert "defined twice" in str(err.value)


def test_site_recipe_colliding_with_shipped_names_both_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    shipped = recipe_catalog()["tiny_gpt"]
    site = write_site(tmp_path / "site", {"recipes/mine/tiny_gpt.yaml": shipped.read_text()})
    monkeypatch.setenv("KILOCARD_CONFIG_PATH", str(site))
    for call in (lambda: compose(["recipe=tiny_moe"]), recipe_catalog):
        with pytest.raises(ComposeError) as err:
            call()
        assert str(shipped) in str(err.value) and str(site / "recipes" / "mine" / "tiny_gpt.yaml") in str(err.value)


def test_two_site_dirs_colliding_name_both_files(site: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    other = write_site(tmp_path / "other", {f"cluster/{SITE_CLUSTER}.yaml": "name: x\n"})
    monkeypatch.delenv("KILOCARD_CONFIG_PATH", raising=False)
    with pytest.raises(ComposeError) as err:
        compose([f"hydra.searchpath=[{site},{other}]"])
    assert f"{site}/cluster/{SITE_CLUSTER}.yaml" in str(err.value)
    assert f"{other}/cluster/{SITE_CLUSTER}.yaml" in str(err.value)


def test_site_recipe_without_global_package_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    site = write_site(tmp_path / "site", {"recipes/mine/headless.yaml": "recipe: {name: headless}\n"})
    monkeypatch.setenv("KILOCARD_CONFIG_PATH", str(site))
    with pytest.raises(ComposeError, match=r"recipe: .*headless.yaml does not start with the line '# @package _glob"):
        compose(["recipe=headless"])


@pytest.mark.parametrize(
    "env, overrides, message",
    [
        ("{tmp}/absent", [], r"KILOCARD_CONFIG_PATH: .*absent is not a directory \(got '.*absent'; expected dir"),
        ("", ["hydra.searchpath=[{tmp}/absent]"], r"hydra.searchpath: .*absent is not a directory"),
        ("", ["hydra.searchpath=[ftp://x]"], r"hydra.searchpath: unknown scheme 'ftp'"),
        ("", ["hydra.searchpath=[pkg://no_such_module_h9]"], r"hydra.searchpath: no importable package"),
        ("", ["hydra.searchpath=3"], r"hydra.searchpath: not a list of directories \(got '3'"),
    ],
)
def test_bad_site_dirs_are_one_line(env, overrides, message, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KILOCARD_CONFIG_PATH", env.format(tmp=tmp_path))
    with pytest.raises(ComposeError, match=message):
        compose([o.format(tmp=tmp_path) for o in overrides])


def test_pkg_searchpath_entry_is_the_package_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    package = write_site(tmp_path / "mysite_conf", {"__init__.py": "", f"cluster/{SITE_CLUSTER}.yaml": "name: pkg\n"})
    monkeypatch.syspath_prepend(str(package.parent))
    monkeypatch.delenv("KILOCARD_CONFIG_PATH", raising=False)
    cfg = compose(["hydra.searchpath=[pkg://mysite_conf]", f"cluster={SITE_CLUSTER}"])
    assert cfg.cluster.name == "pkg"


def test_catalog_cache_key_follows_site_files(site: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from kilocard.recipes import _cache_key

    monkeypatch.delenv("KILOCARD_CONFIG_PATH", raising=False)
    shipped_only = _cache_key()
    monkeypatch.setenv("KILOCARD_CONFIG_PATH", str(site))
    with_site = _cache_key()
    (site / "cluster" / f"{SITE_CLUSTER}.yaml").write_text("name: changed\n")
    assert len({shipped_only, with_site, _cache_key()}) == 3


def kilocard(args: list[str], site: Path, tmp_path: Path) -> subprocess.CompletedProcess:
    """The real ``kilocard`` console command with ``KILOCARD_CONFIG_PATH`` set to ``site``."""
    script = Path(sys.executable).parent / "kilocard"
    command = [str(script)] if script.exists() else [sys.executable, "-m", "kilocard.cli"]
    env = {**os.environ, "KILOCARD_CONFIG_PATH": str(site), "KILOCARD_CACHE_DIR": str(tmp_path / "cache")}
    return subprocess.run([*command, *args], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)


@pytest.mark.integration  # runs the kilocard console script
def test_cli_show_and_validate_with_env_var(site: Path, tmp_path: Path) -> None:
    shown = kilocard(["show", f"recipe={SITE_RECIPE}", "-p", "cluster.partition"], site, tmp_path)
    assert (shown.returncode, shown.stdout.strip()) == (0, "gpu"), shown.stderr
    checked = kilocard(["validate", f"recipe={SITE_RECIPE}", "--format", "json"], site, tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert '"world_size": 16' in checked.stdout


@pytest.mark.integration  # runs the kilocard console script
def test_cli_collision_is_exit_2_one_line(tmp_path: Path) -> None:
    site = write_site(tmp_path / "site", {"cluster/local_cpu.yaml": "name: local_cpu\n"})
    out = kilocard(["validate"], site, tmp_path)
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1 and "Traceback" not in out.stderr
    assert str(site / "cluster" / "local_cpu.yaml") in out.stderr
    assert str(data_dir("conf") / "cluster" / "local_cpu.yaml") in out.stderr


def test_shipped_folders_named_as_site_dirs_are_already_there(monkeypatch: pytest.MonkeyPatch) -> None:
    """Naming kilocard's own conf/ (or the folder holding recipes/) is no collision with itself."""
    monkeypatch.setenv("KILOCARD_CONFIG_PATH", f"{data_dir('conf')}{os.pathsep}{data_dir('recipes').parent}")
    assert to_run_config(compose(["recipe=tiny_moe"])).model.name == "tiny_moe"
