"""No value of the process environment reaches the disk: resolver references are refused or made names.

A composed config is written resolved (``config.yaml``, ``plan.json``, the batch script, the run
directory's name), so any OmegaConf interpolation that reads the environment would put the
variable's value on disk. This runs on the unresolved config, before anything is resolved or written,
and finds interpolations with OmegaConf's own grammar (every spelling: ``${oc.env: NAME}``,
``${oc.env:'NAME'}``, ``pre${oc.env:NAME}``, resolvers nested in resolvers...):

* ``launcher.env.NAME`` or ``cluster.env.NAME`` = exactly ``${oc.env:NAME}`` (its own name) becomes
  a pass-through name in ``launcher.secret_env``: the job reads it from the submitting shell;
* any other interpolation in ``launcher.env``, ``cluster.env`` or ``launcher.job_name`` is refused;
* a resolver anywhere else (``${oc.env:...}``, ``${oc.decode:...}``...) is refused;
* an escaped interpolation (``\\${oc.env:S}``) anywhere is refused too: it resolves to the text
  ``${oc.env:S}``, which the frozen config would hold and every rank loading it would resolve
  again, reading its own environment (``refuse_live_text`` checks the frozen config for this).
Every refusal is a ``ComposeError`` naming the field and pointing at ``launcher.secret_env``.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.grammar.gen.OmegaConfGrammarParser import OmegaConfGrammarParser
from omegaconf.grammar_parser import GrammarParseError, parse

from kilocard.config.explain import ComposeError

#: The one form kept: ``${oc.env:NAME}``, exactly, under the key ``NAME``.
CANONICAL = re.compile(r"\$\{oc\.env:([A-Za-z_][A-Za-z0-9_]*)\}")
#: An escaped interpolation: OmegaConf turns ``\${`` into the literal text ``${``.
ESCAPED = re.compile(r"\\\$\{")
#: Fields whose value may hold no interpolation at all (besides the canonical secret form).
NO_INTERPOLATION = ("launcher.env", "cluster.env", "launcher.job_name")
HINT = "pass secrets by name: launcher.secret_env=[NAME] and `export NAME=...` in the submitting shell"


def _leaves(node: object, path: str = "") -> Iterator[tuple[str, object]]:
    """``(dotted path, value)`` of every leaf of a plain container (list items as ``path[i]``)."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _leaves(value, f"{path}.{key}" if path else str(key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _leaves(value, f"{path}[{i}]")
    else:
        yield path, node


def _walk(tree: object) -> Iterator[object]:
    yield tree
    for child in getattr(tree, "children", None) or []:
        yield from _walk(child)


def interpolation_kinds(text: str) -> set[str]:
    """``{"node"}``, ``{"resolver"}``, both or neither: what OmegaConf would resolve in ``text``.

    Text OmegaConf cannot parse counts as a resolver: it would fail or be resolved unpredictably.
    """
    if "${" not in text:
        return set()
    try:
        tree = parse(text)
    except GrammarParseError:
        return {"resolver"}
    kinds = set()
    for node in _walk(tree):
        if isinstance(node, OmegaConfGrammarParser.InterpolationResolverContext):
            kinds.add("resolver")
        elif isinstance(node, OmegaConfGrammarParser.InterpolationNodeContext):
            kinds.add("node")
    return kinds


def _refuse(field: str, text: str, why: str) -> ComposeError:
    return ComposeError(f"{field}: {why}; {HINT}", field=field, value=text)


def _check(field: str, text: str) -> str | None:
    """The secret name to pass through for ``field``, ``None`` for a plain value; ``ComposeError`` otherwise."""
    if ESCAPED.search(text):
        raise _refuse(field, text, "an escaped interpolation (\\${...}) becomes a live one in the frozen config")
    kinds = interpolation_kinds(text)
    if not kinds:
        return None
    if not field.startswith(NO_INTERPOLATION):
        if "resolver" in kinds:
            raise _refuse(field, text, "a resolver (${name:...}) would write what it reads into the run directory")
        return None
    m = CANONICAL.fullmatch(text)
    name = field.rsplit(".", 1)[-1]
    if m is None or field.startswith("launcher.job_name"):
        raise _refuse(field, text, "an interpolation here would be resolved and written to disk (names, files)")
    if m.group(1) != name:
        raise _refuse(field, text, f"a secret is passed through under its own name ({m.group(1)}, not {name})")
    return name


def refuse_live_text(container: object, where: str) -> None:
    """Refuse a resolved config (``where``: the file it goes to or comes from) that still holds
    interpolation text (``${...}``): resolved once at freeze time, a config never resolves again."""
    for field, value in _leaves(container):
        if isinstance(value, str) and "${" in value:
            raise ComposeError(
                f"{field}: {where} would hold an interpolation (${{...}}) that is resolved again where it is "
                f"read; {HINT}",
                field=field,
                value=value,
            )


def extract_secret_refs(cfg: DictConfig) -> list[str]:
    """Refuse environment-reading interpolations; move ``launcher/cluster.env.NAME='${oc.env:NAME}'`` to
    ``launcher.secret_env`` (returns the names moved). Call it before resolving or writing ``cfg``."""
    raw = OmegaConf.to_container(cfg, resolve=False)
    assert isinstance(raw, dict)
    raw.pop("hydra", None)
    moved: list[tuple[str, str]] = []
    for field, value in _leaves(raw):
        name = _check(field, value) if isinstance(value, str) else None
        if name is not None:
            moved.append((field.split(".", 1)[0], name))
    with open_dict(cfg):
        for group, name in moved:
            del cfg[group].env[name]
            if name not in cfg.launcher.secret_env:
                cfg.launcher.secret_env.append(name)
    return [name for _, name in moved]
