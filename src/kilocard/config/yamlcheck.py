"""Read config YAML safely before Hydra loads it: one line naming the file and line, never a hang.

Hydra loads recipes and config-group files with OmegaConf's YAML loader, which raises a bare
``yaml`` error (a traceback) on a duplicate key or a ``!!python/...`` tag, and expands aliases
into a full tree: a file of nested aliases (an "alias bomb", a few hundred bytes) would take
exponential time and memory. ``check_yaml_file`` composes the file's node graph (aliases stay
shared references, so this is linear in the file) and refuses, naming file and line:

* a key that appears twice in one mapping;
* a tag that safe loading does not know (``!!python/object...``, ``!custom``);
* aliases that would expand to more than ``MAX_VALUES`` values (shipped recipes hold a few hundred);
* a top level that is not a mapping (``~/.netrc`` or an SSH key parses as one long string, which
  OmegaConf would turn into a field name and print in its error).

The file itself is read through ``kilocard.base.safe_read`` (a regular UTF-8 file of bounded size),
and no error quotes the file's content.
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path

import yaml

from kilocard.base.safe_read import FileReadError, open_regular, read_text, yaml_problem
from kilocard.config.explain import ComposeError

#: The most values (scalars, lists, maps) one config file may expand to once aliases are followed.
MAX_VALUES = 100_000
#: Tags YAML's safe loader resolves; any other (``python/...``, local ``!tags``) is refused.
SAFE_TAG_PREFIX = "tag:yaml.org,2002:"
SAFE_TAGS = {
    SAFE_TAG_PREFIX + t
    for t in ("str", "int", "float", "bool", "null", "seq", "map", "timestamp", "binary", "merge", "set")
    + ("omap", "pairs")
}
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def check_yaml_file(path: Path) -> None:
    """Raise ``ComposeError`` (one line: ``FILE:LINE: what; fix``) when ``path`` is not safe, plain YAML
    (or not a regular UTF-8 file of at most ``TEXT_LIMIT`` bytes: ``kilocard.base.safe_read``)."""
    try:
        with open_regular(path) as f:
            st = os.fstat(f.fileno())
    except FileReadError as e:
        raise ComposeError(str(e)) from None
    _check(str(path), st.st_mtime_ns, st.st_size)


def read_config_text(path: Path) -> str:
    """The text of a config file through the safe reader (``ComposeError`` when it cannot be read)."""
    try:
        return read_text(path)
    except FileReadError as e:
        raise ComposeError(str(e)) from None


@lru_cache(maxsize=1024)
def _check(path: str, mtime_ns: int, size: int) -> None:
    """``check_yaml_file`` for one version of a file (the key changes when the file does)."""
    text = read_config_text(Path(path))
    try:
        root = yaml.compose(text, Loader=_LOADER)
    except yaml.MarkedYAMLError as e:
        line, what = yaml_problem(e)
        raise ComposeError(f"{path}{line}: not valid YAML ({what}); fix the file") from None
    except (yaml.YAMLError, RecursionError) as e:
        raise ComposeError(f"{path}: not readable YAML ({type(e).__name__}); fix the file") from None
    if root is None:
        return
    if not isinstance(root, yaml.MappingNode):
        kind = "a list" if isinstance(root, yaml.SequenceNode) else "a single value"
        raise ComposeError(
            f"{path}: holds {kind}, not a mapping of fields (is it a config file?); a config file maps "
            "field names to values (model: ..., trainer: ...)"
        )
    _Walk(path).values(root)


class _Walk:
    """One pass over a node graph: every distinct node is checked once; expanded sizes are memoised."""

    def __init__(self, path: str):
        self.path = path
        self.sizes: dict[int, int] = {}

    def fail(self, node: yaml.Node, what: str) -> ComposeError:
        return ComposeError(f"{self.path}:{node.start_mark.line + 1}: {what}")

    def values(self, node: yaml.Node) -> int:
        """How many values ``node`` expands to (aliases followed); checks it on the first visit."""
        known = self.sizes.get(id(node))
        if known is not None:
            return known
        if node.tag not in SAFE_TAGS:
            raise self.fail(
                node,
                f"tag {node.tag.replace(SAFE_TAG_PREFIX, '!!')} is not allowed; configs hold plain values, "
                "lists and maps (safe loading): remove the tag",
            )
        if isinstance(node, yaml.MappingNode):
            self.unique_keys(node)
            children = [n for pair in node.value for n in pair]
        elif isinstance(node, yaml.SequenceNode):
            children = list(node.value)
        else:
            children = []
        total = 1 + sum(self.values(c) for c in children)
        if total > MAX_VALUES:
            raise self.fail(
                node,
                f"aliases expand to more than {MAX_VALUES} values (an alias bomb?); write the values out or "
                "use an interpolation ${...}",
            )
        self.sizes[id(node)] = total
        return total

    def unique_keys(self, node: yaml.MappingNode) -> None:
        """Refuse a key given twice in one mapping (YAML's merge key ``<<`` excepted)."""
        first: dict[str, yaml.Node] = {}
        for key, _ in node.value:
            if not isinstance(key, yaml.ScalarNode) or key.tag == SAFE_TAG_PREFIX + "merge":
                continue
            if key.value in first:
                raise self.fail(
                    key,
                    f"duplicate key {key.value!r} (first at line {first[key.value].start_mark.line + 1}); "
                    "keep one of them",
                )
            first[key.value] = key
