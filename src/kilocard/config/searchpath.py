"""Where configs come from: kilocard's shipped folders, then a site's own directories.

A site keeps its cluster profiles, recipes and any other config group outside the package, in
directories laid out like kilocard's own (``cluster/<name>.yaml``, ``recipes/<family>/<name>.yaml``,
``model/<name>.yaml`` ...), named by ``KILOCARD_CONFIG_PATH=dir1:dir2`` or by Hydra's own
``hydra.searchpath=[dir1,file://dir2,pkg://module]`` override (both together: the environment's
first). Each becomes an entry of Hydra's config search path after the shipped ones, so its files are
new options of the same groups (``cluster=mysite_h100``, ``recipe=mysite_llama``). A file whose name
is already taken (by a shipped config or an earlier site directory) would be shadowed silently by
Hydra, so it is an error naming both files.

A recipe may also be given as a path (``recipe=./my_recipe.yaml``): it is read from that file and
composed as the ``_global_`` package, like a catalogued recipe.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path

import yaml
from hydra.core.config_store import ConfigStore
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from kilocard.config.explain import ComposeError, problem
from kilocard.config.yamlcheck import check_yaml_file, read_config_text
from kilocard.paths import data_dir

ENV_VAR = "KILOCARD_CONFIG_PATH"
"""Site config directories, separated by ``os.pathsep`` (``:`` on Linux)."""
SEARCHPATH_KEY = "hydra.searchpath"
RECIPE_GROUP = "recipes"
"""The Hydra group that holds recipes (``recipe=NAME`` selects ``recipes=<family>/NAME``)."""
PATH_RECIPE_FAMILY = "_file"
"""The family under which a recipe given by path is registered in Hydra's ConfigStore."""
SITE_LAYOUT = "directories each holding cluster/, recipes/<family>/ or another config group"


@dataclass(frozen=True)
class ConfigRoots:
    """The config search path of one composition: shipped folders plus site directories."""

    site: tuple[Path, ...] = ()
    """Site directories, in search order (``KILOCARD_CONFIG_PATH`` first, then ``hydra.searchpath``)."""

    def hydra_searchpath(self) -> str:
        """The one ``hydra.searchpath`` override that puts the shipped recipes and every site dir on the path."""
        roots = [data_dir(RECIPE_GROUP).parent, *self.site]
        return f"{SEARCHPATH_KEY}=[{','.join(_quoted(str(r)) for r in roots)}]"

    def group_options(self, group: str) -> list[str]:
        """Every option of a config group (``recipe``: every recipe name), shipped and site."""
        if group == "recipe":
            return list(self.recipe_catalog())
        folders = [data_dir("conf") / group, *(root / group for root in self.site)]
        return sorted({p.stem for folder in folders for p in folder.glob("*.yaml")})

    def recipe_catalog(self) -> dict[str, Path]:
        """Map recipe name to its YAML file: the shipped recipes, then each site's ``recipes/<family>/``."""
        catalog = dict(shipped_recipes())
        for root in self.site:
            for path in recipe_files(root):
                if path.stem in catalog:
                    raise _collision("recipe", catalog[path.stem], path, f"another file name than {path.name}")
                catalog[path.stem] = path
        return catalog

    def checked_catalog(self) -> dict[str, Path]:
        """The recipe catalog, once no site file takes a name already in use (else ``ComposeError``
        naming both files)."""
        seen = {rel: path for rel, path in group_files(data_dir("conf")).items()}
        for root in self.site:
            for rel, path in group_files(root).items():
                if rel in seen:
                    group = rel.rpartition("/")[0] or "config"
                    raise _collision(group, seen[rel], path, f"another file name than {rel}")
                seen[rel] = path
        catalog = self.recipe_catalog()
        for root in self.site:
            for path in recipe_files(root):
                _require_global_package(path)
        return catalog


def _require_global_package(path: Path) -> None:
    """A catalogued recipe sets fields of every group, so its first line must be ``# @package _global_``
    (without it Hydra reports an obscure "Could not override 'model@recipes.model'")."""
    first = next((line.strip() for line in read_config_text(path).splitlines() if line.strip()), "")
    if re.fullmatch(r"#\s*@package\s+_global_", first) is None:  # its first line is not echoed: it may be a secret
        raise problem(
            "recipe",
            f"{path} does not start with the line '# @package _global_'",
            None,
            "'# @package _global_' as its first line, as in every shipped recipe",
        )


def _collision(name: str, first: Path, second: Path, fix: str) -> ComposeError:
    """A config name taken twice; Hydra would silently use the first file, so both are named."""
    return ComposeError(
        f"{name}: {second.stem!r} is defined twice, in {first} and in {second} (a site directory adds "
        f"options, it cannot replace one that exists; expected {fix})",
        field=name,
        value=str(second),
    )


def _quoted(text: str) -> str:
    """A Hydra grammar string literal (so a path may hold spaces, commas or brackets)."""
    return "'" + text.replace("'", "\\'") + "'"


@lru_cache(maxsize=1)
def shipped_recipes() -> dict[str, Path]:
    """The shipped recipe catalog (cached: it cannot change while kilocard runs)."""
    catalog: dict[str, Path] = {}
    for path in recipe_files(data_dir(RECIPE_GROUP).parent):
        if path.stem in catalog:
            raise ComposeError(f"recipe name {path.stem!r} is defined twice: {catalog[path.stem]} and {path}")
        catalog[path.stem] = path
    return catalog


def recipe_files(root: Path) -> list[Path]:
    """Every ``recipes/<family>/<name>.yaml`` under ``root``."""
    return sorted((root / RECIPE_GROUP).glob("*/*.yaml"))


@lru_cache(maxsize=1)
def config_groups() -> tuple[str, ...]:
    """The config groups kilocard composes (``model``, ``cluster``...): the shipped ``conf/`` folders."""
    return tuple(sorted(p.name for p in data_dir("conf").iterdir() if p.is_dir()))


def group_files(root: Path) -> dict[str, Path]:
    """Every config file of ``root`` outside ``recipes/`` (its top-level ``*.yaml`` and those under a
    config group's folder), keyed by its path relative to ``root``. Only those folders are walked, so a
    site directory such as ``/`` is not searched whole (nor ``/proc``)."""
    out: dict[str, Path] = {}
    found = [
        *root.glob("*.yaml"),
        *(p for g in config_groups() if (root / g).is_dir() for p in (root / g).rglob("*.yaml")),
    ]
    for path in sorted(found):
        out[path.relative_to(root).as_posix()] = path
    return out


def env_site_dirs(environ: os._Environ[str] | dict[str, str] | None = None) -> list[Path]:
    """The directories named by ``KILOCARD_CONFIG_PATH`` (empty entries ignored)."""
    raw = (os.environ if environ is None else environ).get(ENV_VAR, "")
    return [_site_dir(entry, ENV_VAR, raw) for entry in raw.split(os.pathsep) if entry.strip()]


def _site_dir(entry: str, field: str, given: str) -> Path:
    """One site directory, absolute; ``ComposeError`` naming ``field`` when it is not a directory."""
    path = Path(entry.strip()).expanduser().absolute()
    if not path.is_dir():
        raise problem(field, f"{path} is not a directory", given, SITE_LAYOUT)
    return path


def _searchpath_entry(entry: str, given: str) -> Path:
    """A ``hydra.searchpath`` entry (``dir``, ``file://dir`` or ``pkg://module``) as a directory."""
    scheme, sep, rest = entry.partition("://")
    if not sep:
        return _site_dir(entry, SEARCHPATH_KEY, given)
    if scheme == "file":
        return _site_dir(rest, SEARCHPATH_KEY, given)
    if scheme == "pkg":
        module, _, sub = rest.partition("/")
        try:
            folder = resources.files(module).joinpath(sub) if sub else resources.files(module)
        except (ModuleNotFoundError, TypeError, ValueError):
            raise problem(SEARCHPATH_KEY, f"no importable package {module!r}", given, SITE_LAYOUT) from None
        return _site_dir(str(folder), SEARCHPATH_KEY, given)
    raise problem(SEARCHPATH_KEY, f"unknown scheme {scheme!r}", given, "a directory, file://DIR or pkg://MODULE")


def split_searchpath(overrides: list[str]) -> tuple[list[Path], list[str]]:
    """Directories a ``hydra.searchpath=[...]`` override names, and the other overrides."""
    dirs: list[Path] = []
    rest: list[str] = []
    for o in overrides:
        key, _, value = o.partition("=")
        if key.lstrip("+") != SEARCHPATH_KEY:
            rest.append(o)
            continue
        try:
            parsed = OverridesParser.create().parse_override(f"{SEARCHPATH_KEY}={value}").value()
        except HydraException:
            parsed = None
        if not isinstance(parsed, list) or not all(isinstance(x, str) for x in parsed):
            raise problem(SEARCHPATH_KEY, "not a list of directories", value, "[dir1,dir2] (file:// and pkg:// too)")
        dirs.extend(_searchpath_entry(entry, value) for entry in parsed)
    return dirs, rest


def config_roots(overrides: list[str]) -> tuple[ConfigRoots, list[str]]:
    """The search path for ``overrides`` (environment + ``hydra.searchpath``) and the remaining overrides."""
    from_override, rest = split_searchpath(overrides)
    shipped = {data_dir("conf").resolve(), data_dir(RECIPE_GROUP).parent.resolve()}
    site = [d for d in dict.fromkeys([*env_site_dirs(), *from_override]) if d.resolve() not in shipped]
    return ConfigRoots(tuple(site)), rest  # a directory named twice counts once; shipped ones are there already


def is_recipe_path(value: str) -> bool:
    """``recipe=`` names a file rather than a catalogued recipe (catalog names hold no ``/`` or suffix)."""
    return value.endswith((".yaml", ".yml")) or "/" in value or os.sep in value


def register_path_recipe(value: str) -> tuple[str, Path]:
    """Read the recipe file ``value`` into Hydra's ConfigStore; return its group option and its path."""
    path = Path(value).expanduser().absolute()
    expected = "a recipe YAML file (recipe=./my_recipe.yaml) or a name that `kilocard recipes` lists"
    if not path.exists() and not path.is_symlink():
        raise problem("recipe", "no such recipe file", value, expected)
    check_yaml_file(path)  # a regular UTF-8 file; duplicate keys, non-safe tags, alias bombs: refused first
    try:
        node = OmegaConf.create(read_config_text(path))
    except (yaml.YAMLError, OmegaConfBaseException) as e:  # never the text: the file may hold a secret
        raise problem("recipe", f"{path} is not readable YAML ({type(e).__name__})", value, expected) from None
    if not isinstance(node, DictConfig):
        raise problem("recipe", f"{path} does not hold a mapping", value, expected)
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", path.stem)
    ConfigStore.instance().store(group=f"{RECIPE_GROUP}/{PATH_RECIPE_FAMILY}", name=name, node=node, package="_global_")
    return f"{RECIPE_GROUP}={PATH_RECIPE_FAMILY}/{name}", path


__all__ = [
    "ENV_VAR",
    "ConfigRoots",
    "config_roots",
    "env_site_dirs",
    "is_recipe_path",
    "register_path_recipe",
    "shipped_recipes",
    "split_searchpath",
]
