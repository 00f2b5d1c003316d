"""Compose a run config exactly as a user asks for it: Hydra's public compose API, struct mode.

``recipe=NAME`` selects ``recipes/<family>/NAME.yaml`` (Hydra's experiment pattern, package
``_global_``); every other override is plain Hydra grammar (``a.b=v``, ``+a.new=v``, ``~a.b``,
``group=option``, and ``a=1,2`` sweeps with ``multirun=True``). Composition errors become one
``ComposeError`` naming the field, the value and what was expected, with the closest valid names.
"""

from __future__ import annotations

import difflib
import itertools
import re
from dataclasses import fields, is_dataclass
from functools import lru_cache
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from hydra.core.config_store import ConfigStore
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from kilocard.config.schema import RunConfig
from kilocard.paths import data_dir

SCHEMA_NAME = "kilocard_schema"
RECIPE_GROUP = "recipes"


class ComposeError(Exception):
    """A config that cannot be composed: ``field``, ``value`` and a one-line ``message``."""

    def __init__(self, message: str, field: Optional[str] = None, value: object = None):
        super().__init__(message)
        self.field = field
        self.value = value


def register_schema() -> None:
    """Register the typed ``RunConfig`` root in Hydra's ConfigStore (idempotent)."""
    ConfigStore.instance().store(name=SCHEMA_NAME, node=RunConfig)


@lru_cache(maxsize=1)
def recipe_catalog() -> Dict[str, Path]:
    """Map recipe name to its YAML file, for every ``recipes/<family>/<name>.yaml``."""
    catalog: Dict[str, Path] = {}
    for path in sorted(data_dir("recipes").glob("*/*.yaml")):
        if path.stem in catalog:
            raise ComposeError(f"recipe name {path.stem!r} is defined twice: {catalog[path.stem]} and {path}")
        catalog[path.stem] = path
    return catalog


def schema_paths(cls: type = RunConfig, prefix: str = "") -> List[str]:
    """Every dotted field path of the schema (``trainer.global_batch_size``, ...)."""
    out: List[str] = []
    for f in fields(cls):
        path = f"{prefix}{f.name}"
        default = f.default_factory() if callable(f.default_factory) else f.default  # type: ignore[misc]
        if is_dataclass(default):
            out.extend(schema_paths(type(default), path + "."))
        else:
            out.append(path)
    return out


def _suggest(word: str, choices: Sequence[str]) -> str:
    close = difflib.get_close_matches(word, list(choices), n=3, cutoff=0.6)
    return f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""


def _group_options(group: str) -> List[str]:
    return sorted(p.stem for p in (data_dir("conf") / group).glob("*.yaml"))


def _translate_recipe(override: str) -> str:
    """``recipe=NAME`` -> ``recipes=<family>/NAME``; anything else unchanged."""
    m = re.fullmatch(r"recipe=(.*)", override)
    if not m:
        return override
    name = m.group(1).strip()
    catalog = recipe_catalog()
    if name not in catalog:
        raise ComposeError(
            f"recipe: unknown recipe {name!r}{_suggest(name, list(catalog))} "
            f"(run `kilocard recipes` for the list)",
            field="recipe",
            value=name,
        )
    return f"{RECIPE_GROUP}={catalog[name].parent.name}/{name}"


def expand_sweeps(overrides: Sequence[str], multirun: bool) -> List[List[str]]:
    """Expand Hydra sweep overrides (``a=1,2``) into the cartesian product of override lists."""
    try:
        parsed = OverridesParser.create().parse_overrides(list(overrides))
    except HydraException as e:
        raise ComposeError(f"cannot parse overrides: {str(e).splitlines()[0]}") from None
    axes: List[List[str]] = []
    for o in parsed:
        key = o.get_key_element()
        if o.is_sweep_override():
            if not multirun:
                raise ComposeError(
                    f"{key}: {o.input_line!r} is a sweep; add --multirun to run one config per value",
                    field=key.lstrip("+~"),
                    value=o.input_line,
                )
            axes.append([f"{key}={v}" for v in o.sweep_string_iterator()])
        else:
            axes.append([o.input_line])
    return [list(combo) for combo in itertools.product(*axes)] if axes else [[]]


def _explain(exc: BaseException, overrides: Sequence[str]) -> ComposeError:
    """Turn a Hydra/OmegaConf composition error into one line naming field, value, expectation."""
    cause = exc.__cause__ or exc.__context__
    text = f"{exc}\n{cause}" if cause is not None else str(exc)
    full_key = getattr(cause, "full_key", None) or getattr(exc, "full_key", None)
    m = re.search(r"Could not find '([^']+)/([^']+)'", text)
    if m:
        group, option = m.group(1), m.group(2)
        if group == RECIPE_GROUP:
            group = "recipe"
        opts = _group_options(group) if group != "recipe" else list(recipe_catalog())
        return ComposeError(
            f"{group}: no option {option!r}{_suggest(option, opts)} (available: {', '.join(opts)})",
            field=group,
            value=option,
        )
    if "is not in struct" in text or re.search(r"Key '[^']+' (?:is )?not in", text):
        key = full_key or _override_key_in(text, overrides) or "?"
        leaf = key.rsplit(".", 1)[-1]
        parent = key.rsplit(".", 1)[0] if "." in key else ""
        siblings = [p.rsplit(".", 1)[-1] for p in schema_paths() if p.startswith(parent + ".")] if parent else []
        hint = _suggest(leaf, siblings) or _suggest(key, schema_paths())
        return ComposeError(f"{key}: unknown field{hint} (see `kilocard show` for every field)", field=key)
    m = re.search(r"Value '([^']*)' (?:of type '(\w+)' )?could not be converted to (\w+)", text)
    if m:
        key = full_key or _override_key_in(text, overrides) or "?"
        return ComposeError(
            f"{key}: {m.group(1)!r} is not a valid {m.group(3).lower()} value (expected {_EXPECT.get(m.group(3), m.group(3))})",
            field=key,
            value=m.group(1),
        )
    m = re.search(r"Value '([^']*)' is not a valid bool", text)
    if m:
        key = full_key or _override_key_in(text, overrides) or "?"
        return ComposeError(f"{key}: {m.group(1)!r} is not a valid bool value (expected true or false)", field=key, value=m.group(1))
    first = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
    key = full_key or _override_key_in(text, overrides)
    return ComposeError(f"{key + ': ' if key else ''}{first}", field=key)


_EXPECT = {"Integer": "a whole number, e.g. 512", "Float": "a number, e.g. 3e-4", "Boolean": "true or false"}


def _override_key_in(text: str, overrides: Sequence[str]) -> Optional[str]:
    for o in overrides:
        key = o.split("=", 1)[0].lstrip("+~")
        if key and key in text:
            return key
    return None


def compose(overrides: Sequence[str] = (), return_hydra_config: bool = False) -> DictConfig:
    """Compose one config (struct mode) from Hydra overrides; raise ``ComposeError`` on bad input."""
    return compose_each([overrides], return_hydra_config)[0]


def compose_each(override_lists: Sequence[Sequence[str]], return_hydra_config: bool = False) -> List[DictConfig]:
    """Compose several configs under one Hydra initialisation (the catalog and sweeps use it)."""
    register_schema()
    search_root = data_dir("recipes").parent.as_uri()
    GlobalHydra.instance().clear()
    out: List[DictConfig] = []
    try:
        with initialize_config_dir(config_dir=str(data_dir("conf")), version_base="1.3", job_name="kilocard"):
            for overrides in override_lists:
                translated = [_translate_recipe(o) for o in overrides]
                try:
                    cfg = hydra_compose(
                        config_name="config",
                        overrides=[f"hydra.searchpath=[{search_root}]", *translated],
                        return_hydra_config=return_hydra_config,
                    )
                except (HydraException, OmegaConfBaseException, ValueError) as e:
                    raise _explain(e, translated) from None
                OmegaConf.set_struct(cfg, True)
                _reject_unknown_keys(cfg)
                out.append(cfg)
    finally:
        GlobalHydra.instance().clear()
    return out


def _leaf_paths(node: object, prefix: str = "") -> List[str]:
    if isinstance(node, dict):
        return [p for k, v in node.items() for p in _leaf_paths(v, f"{prefix}{k}.")]
    return [prefix[:-1]]


def _reject_unknown_keys(cfg: DictConfig) -> None:
    """``+group.new=v`` may add keys only inside free-form dict fields (``cluster.env``...)."""
    known = set(schema_paths())
    container = OmegaConf.to_container(cfg, resolve=False)
    assert isinstance(container, dict)
    container.pop("hydra", None)
    for path in _leaf_paths(container):
        if path in known or any(path.startswith(k + ".") for k in known):
            continue
        parent, _, leaf = path.rpartition(".")
        siblings = [p.rsplit(".", 1)[-1] for p in known if p.rpartition(".")[0] == parent]
        raise ComposeError(
            f"{path}: unknown field{_suggest(leaf, siblings) or _suggest(path, sorted(known))} "
            f"(see `kilocard show` for every field)",
            field=path,
        )


def compose_many(overrides: Sequence[str], multirun: bool = False) -> List[Tuple[List[str], DictConfig]]:
    """Compose one config per sweep point: ``[(overrides, cfg), ...]``."""
    combos = expand_sweeps(overrides, multirun)
    return list(zip(combos, compose_each(combos)))


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
    """Load a frozen ``config.yaml`` (from a run directory) into the typed schema."""
    try:
        loaded = OmegaConf.load(path)
    except Exception as e:  # yaml errors carry no common base class
        raise ComposeError(f"{path}: not a readable config ({e})") from None
    return to_run_config(loaded)  # type: ignore[arg-type]
