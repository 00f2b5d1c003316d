"""Compose a run config exactly as a user asks for it: Hydra's public compose API, struct mode.

``recipe=NAME`` selects ``recipes/<family>/NAME.yaml`` (Hydra's experiment pattern, package
``_global_``), ``recipe=PATH.yaml`` a recipe file; site directories (``KILOCARD_CONFIG_PATH``,
``hydra.searchpath``) join the search path (``kilocard.config.searchpath``); every other override
is plain Hydra grammar (``a.b=v``, ``+a.new=v``, ``~a.b``, ``group=option``, and ``a=1,2`` sweeps
with ``multirun=True``). Composition errors become one
``ComposeError`` naming the field, the value and what was expected, with the closest valid names.
"""

from __future__ import annotations

import dataclasses
import difflib
import itertools
import re
from collections.abc import Sequence
from functools import lru_cache
from math import prod
from pathlib import Path

import yaml
from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from hydra.core.config_store import ConfigStore
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from kilocard.base.safe_read import FileReadError, read_text
from kilocard.config.explain import ComposeError, explain, override_value, problem, schema_paths, suggest, unknown_field
from kilocard.config.schema import RunConfig
from kilocard.config.searchpath import (
    RECIPE_GROUP,
    ConfigRoots,
    config_roots,
    env_site_dirs,
    group_files,
    is_recipe_path,
    register_path_recipe,
)
from kilocard.config.secrets import refuse_live_text
from kilocard.config.yamlcheck import check_yaml_file
from kilocard.paths import data_dir

SCHEMA_NAME = "kilocard_schema"


@lru_cache(maxsize=1)
def register_schema() -> None:
    """Register the typed ``RunConfig`` root in Hydra's ConfigStore (once per process: it costs
    about a sixth of a compose, and the store outlives ``GlobalHydra.clear()``)."""
    ConfigStore.instance().store(name=SCHEMA_NAME, node=RunConfig)


def recipe_catalog() -> dict[str, Path]:
    """Map recipe name to its YAML file: every ``recipes/<family>/<name>.yaml``, shipped and in the site
    directories of ``KILOCARD_CONFIG_PATH``."""
    return ConfigRoots(tuple(env_site_dirs())).recipe_catalog()


def _group_options(group: str) -> list[str]:
    """The options of a config group (``recipe``: every recipe name), shipped and ``KILOCARD_CONFIG_PATH``'s."""
    return ConfigRoots(tuple(env_site_dirs())).group_options(group)


def _grammar_error(parser: OverridesParser, overrides: Sequence[str]) -> ComposeError:
    """Name the first override that Hydra's grammar rejects; a bare recipe name (``llama3_70b``) gets
    ``did you mean recipe=llama3_70b?`` instead of the parser's words."""
    for o in overrides:
        bare = _bare_name(o)
        if bare:
            return bare
        try:
            parser.parse_override(o)
        except HydraException as e:
            reason = str(e).strip().splitlines()[0]
            key = o.split("=", 1)[0]
            return problem(
                key,
                f"cannot parse override ({reason})",
                o,
                "key=value, +key=value, ~key, group=option or a=1,2 with --multirun",
            )
    return ComposeError(f"cannot parse overrides {' '.join(overrides)!r}")


def _bare_name(token: str) -> ComposeError | None:
    """The error for a bare word (no ``=``, ``+`` or ``~``), ``did you mean recipe=NAME?`` where it names
    (or nearly names) a recipe; ``None`` for anything else."""
    if not re.fullmatch(r"[\w.-]+", token):
        return None
    names = list(recipe_catalog())
    close = [token] if token in names else difflib.get_close_matches(token, names, n=1, cutoff=0.75)
    if close:
        return problem(token, "not an override", token, f"key=value; did you mean recipe={close[0]}?")
    return problem(token, "not an override", token, "key=value (recipe=NAME, a.b=v, group=option), +key=value or ~key")


def _explain(exc: BaseException, overrides: Sequence[str], roots: ConfigRoots | None = None) -> ComposeError:
    return explain(exc, overrides, roots.group_options if roots is not None else _group_options)


def _located(err: ComposeError, overrides: Sequence[str], recipe_file: Path | None) -> ComposeError:
    """Point at the recipe file when the bad field was not given on the command line."""
    given = {o.split("=", 1)[0].lstrip("+~") for o in overrides}
    if err.field is None or err.field in given or recipe_file is None:
        return err
    return ComposeError(f"{err} [set by recipe {recipe_file} or a config it selects]", err.field, err.value)


def _translate_recipe(override: str, catalog: dict[str, Path]) -> tuple[str, Path | None]:
    """``recipe=NAME`` -> ``recipes=<family>/NAME`` (``recipe=PATH.yaml``: the file, registered), with the
    recipe's file; anything else unchanged."""
    m = re.fullmatch(r"recipe=(.*)", override)
    if not m:
        return override, None
    name = m.group(1).strip()
    if is_recipe_path(name):
        return register_path_recipe(name)
    if name not in catalog:
        hint = suggest(name, list(catalog))
        raise problem(
            "recipe", "unknown recipe", name, "a name that `kilocard recipes` lists" + (f"; {hint}" if hint else "")
        )
    return f"{RECIPE_GROUP}={catalog[name].parent.name}/{name}", catalog[name]


def check_sources(roots: ConfigRoots, recipe_file: Path | None) -> None:
    """Safe-load every config-group file (shipped and site) and the chosen recipe before Hydra or
    OmegaConf reads them (``config.yamlcheck``: duplicate keys, non-safe tags, alias bombs)."""
    for root in (data_dir("conf"), *roots.site):
        for path in group_files(root).values():
            check_yaml_file(path)
    if recipe_file is not None:
        check_yaml_file(recipe_file)


def _yaml_error(e: yaml.YAMLError) -> ComposeError:
    """A YAML error that got past ``check_sources`` as one line: file, line, problem."""
    mark = getattr(e, "problem_mark", None)
    where = f"{mark.name}:{mark.line + 1}: " if mark else ""
    return ComposeError(f"{where}not valid YAML ({getattr(e, 'problem', None) or type(e).__name__}); fix the file")


MAX_SWEEP = 100
"""Configs one ``--multirun`` may expand to (each composed and validated; ``sbatch`` writes a run directory for
each), as ``sbatch --chain`` is capped at 100 jobs."""


def expand_sweeps(overrides: Sequence[str], multirun: bool) -> list[list[str]]:
    """Expand Hydra sweep overrides (``a=1,2``) into the cartesian product of override lists, at most
    ``MAX_SWEEP`` of them (counted before any is built: ``range(0,100000)`` is refused at once)."""
    parser = OverridesParser.create()
    try:
        parsed = parser.parse_overrides(list(overrides))
    except HydraException:
        raise _grammar_error(parser, overrides) from None
    axes: list[list[str]] = []
    for o in parsed:
        key = o.get_key_element()
        if o.is_sweep_override():
            if not multirun:
                raise problem(
                    key.lstrip("+~"),
                    "a sweep needs --multirun",
                    (o.input_line or "").partition("=")[2],
                    "one value, or --multirun for one config per value",
                )
            axes.append([f"{key}={v}" for v in itertools.islice(o.sweep_string_iterator(), MAX_SWEEP + 1)])
        else:
            axes.append([o.input_line or ""])
        if prod(len(a) for a in axes) > MAX_SWEEP:
            raise problem(
                key.lstrip("+~"),
                f"the sweep has more than {MAX_SWEEP} points",
                (o.input_line or "").partition("=")[2],
                f"at most {MAX_SWEEP} configs per --multirun (split the sweep into several commands)",
            )
    return [list(combo) for combo in itertools.product(*axes)] if axes else [[]]


def compose(overrides: Sequence[str] = (), return_hydra_config: bool = False) -> DictConfig:
    """Compose one config (struct mode) from Hydra overrides; raise ``ComposeError`` on bad input."""
    return compose_each([overrides], return_hydra_config)[0]


def compose_each(override_lists: Sequence[Sequence[str]], return_hydra_config: bool = False) -> list[DictConfig]:
    """Compose several configs under one Hydra initialisation (the catalog and sweeps use it)."""
    register_schema()
    GlobalHydra.instance().clear()
    out: list[DictConfig] = []
    try:
        with initialize_config_dir(config_dir=str(data_dir("conf")), version_base="1.3", job_name="kilocard"):
            for overrides in override_lists:
                out.append(_compose_one(list(overrides), return_hydra_config))
    finally:
        GlobalHydra.instance().clear()
    return out


def _compose_one(overrides: list[str], return_hydra_config: bool) -> DictConfig:
    """One composition inside an initialised Hydra: site search path, recipe translation, struct mode."""
    roots, rest = config_roots(overrides)
    catalog = roots.checked_catalog()
    pairs = [_translate_recipe(o, catalog) for o in rest]
    translated = [o for o, _ in pairs]
    recipe_file = next((f for _, f in pairs if f is not None), None)
    check_sources(roots, recipe_file)
    try:
        cfg = hydra_compose(
            config_name="config",
            overrides=[roots.hydra_searchpath(), *translated],
            return_hydra_config=return_hydra_config,
        )
    except (HydraException, OmegaConfBaseException, ValueError) as e:
        raise _located(_explain(e, translated, roots), rest, recipe_file) from None
    except yaml.YAMLError as e:
        raise _yaml_error(e) from None
    OmegaConf.set_struct(cfg, True)
    _reject_unknown_keys(cfg, translated)
    return cfg


def _leaf_paths(node: object, prefix: str = "") -> list[str]:
    if isinstance(node, dict):
        return [p for k, v in node.items() for p in _leaf_paths(v, f"{prefix}{k}.")]
    return [prefix[:-1]]


def _reject_unknown_keys(cfg: DictConfig, overrides: Sequence[str]) -> None:
    """``+group.new=v`` may add keys only inside free-form dict fields (``cluster.env``...)."""
    known = set(schema_paths())
    container = OmegaConf.to_container(cfg, resolve=False)
    assert isinstance(container, dict)
    container.pop("hydra", None)
    for path in _leaf_paths(container):
        if path in known or any(path.startswith(k + ".") for k in known):
            continue
        raise unknown_field(path, override_value(path, overrides))


def compose_many(overrides: Sequence[str], multirun: bool = False) -> list[tuple[list[str], DictConfig]]:
    """Compose one config per sweep point: ``[(overrides, cfg), ...]``."""
    combos = expand_sweeps(overrides, multirun)
    return list(zip(combos, compose_each(combos), strict=False))


def to_run_config(cfg: DictConfig) -> RunConfig:
    """Convert a composed DictConfig (hydra node dropped) into the typed ``RunConfig`` tree."""
    if OmegaConf.get_type(cfg) is RunConfig and "hydra" not in cfg:
        # Already typed by the schema (every compose() result): no copy or merge needed (25x faster).
        try:
            return OmegaConf.to_object(cfg)  # type: ignore[return-value]
        except OmegaConfBaseException as e:
            raise _explain(e, []) from None
    cfg = cfg.copy()
    with_flag = OmegaConf.is_struct(cfg)
    OmegaConf.set_struct(cfg, False)
    cfg.pop("hydra", None)
    OmegaConf.set_struct(cfg, with_flag)
    try:
        return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(RunConfig), cfg))  # type: ignore[return-value]
    except OmegaConfBaseException as e:
        raise _explain(e, []) from None


def load_run_config(path: Path) -> RunConfig:
    """Load a frozen ``config.yaml`` (from a run directory) into the typed schema.

    The file was resolved when it was frozen: interpolation text in it (``${...}``) is refused, never
    resolved again (it would read the loading process's environment)."""
    check_yaml_file(path)  # a regular UTF-8 file holding a mapping (else one line, never its content)
    try:
        loaded = OmegaConf.create(read_text(path))
    except FileReadError as e:
        raise ComposeError(f"not a readable config: {e}") from None
    except (yaml.YAMLError, OmegaConfBaseException) as e:
        raise ComposeError(f"{path}: not a readable config ({type(e).__name__})") from None
    if not isinstance(loaded, DictConfig):
        raise ComposeError(f"{path}: not a readable config (it holds no mapping)")
    missing = [f.name for f in dataclasses.fields(RunConfig) if f.name not in loaded]
    if missing:  # a frozen config is written whole: a missing group is a truncated or foreign file
        raise ComposeError(
            f"{path}: not a frozen kilocard config (no {', '.join(missing)}); it is written whole when a run "
            "directory is created: create a new run"
        )
    refuse_live_text(OmegaConf.to_container(loaded, resolve=False), str(path))
    return to_run_config(loaded)
