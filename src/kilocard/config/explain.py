"""One-line explanations of composition errors: the field, the value given, and what was expected.

Hydra and OmegaConf report a bad override as a chain of exceptions with multi-line messages. The
functions here turn such a chain into a single ``ComposeError`` line of the form
``<field>: <problem> (got <value>; expected <what the schema takes>)``, using the typed schema
(``RunConfig``) for the expectation and close matches for misspellings.
"""

from __future__ import annotations

import difflib
import re
import typing
from collections.abc import Callable, Sequence
from dataclasses import fields, is_dataclass
from functools import lru_cache
from typing import Any

from kilocard.config.schema import RunConfig


class ComposeError(Exception):
    """A config that cannot be composed: ``field``, ``value`` and a one-line ``message``."""

    def __init__(self, message: str, field: str | None = None, value: object = None):
        super().__init__(message)
        self.field = field
        self.value = value


def problem(field: str, what: str, value: str | None = None, expected: str | None = None) -> ComposeError:
    """Build the standard one-line error: ``field: what (got value; expected ...)``."""
    details = [f"got {value!r}"] if value is not None else []
    if expected:
        details.append(f"expected {expected}")
    suffix = f" ({'; '.join(details)})" if details else ""
    return ComposeError(f"{field}: {what}{suffix}", field=field, value=value)


@lru_cache(maxsize=1)
def _schema_types() -> dict[str, Any]:
    """Every dotted leaf path of the schema mapped to its resolved type annotation."""
    out: dict[str, Any] = {}

    def walk(cls: type, prefix: str) -> None:
        hints = typing.get_type_hints(cls)
        for f in fields(cls):
            tp = hints[f.name]
            if isinstance(tp, type) and is_dataclass(tp):
                walk(tp, f"{prefix}{f.name}.")
            else:
                out[f"{prefix}{f.name}"] = tp

    walk(RunConfig, "")
    return out


def schema_paths() -> list[str]:
    """Every dotted field path of the schema (``trainer.global_batch_size``, ...)."""
    return list(_schema_types())


def describe_type(tp: Any) -> str:
    """What a value of annotation ``tp`` looks like, in words a user can act on."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Union and type(None) in args:
        inner = [a for a in args if a is not type(None)]
        return f"{describe_type(inner[0])}, or null" if len(inner) == 1 else "a value or null"
    if tp is bool:
        return "true or false"
    if tp is int:
        return "a whole number, e.g. 512"
    if tp is float:
        return "a number, e.g. 3e-4"
    if tp is str:
        return "text"
    if origin in (list, list):
        return "a list, e.g. [a,b]"
    if origin in (dict, dict):
        return "a map of names to text, e.g. {NCCL_DEBUG: INFO}"
    return "any value"


def expected_for(path: str) -> str | None:
    """The expectation for the schema field at ``path``; ``None`` when it is not a schema leaf."""
    tp = _schema_types().get(path)
    return describe_type(tp) if tp is not None else None


def suggest(word: str, choices: Sequence[str]) -> str:
    """``did you mean 'x' or 'y'?`` for close matches, else an empty string."""
    close = difflib.get_close_matches(word, list(choices), n=3, cutoff=0.6)
    return f"did you mean {' or '.join(repr(c) for c in close)}?" if close else ""


def override_value(key: str, overrides: Sequence[str]) -> str | None:
    """The value the user gave ``key`` in ``overrides`` (``None`` when the key is not overridden)."""
    for o in overrides:
        k, sep, v = o.partition("=")
        if k.lstrip("+~") == key:
            return v if sep else None
    return None


def unknown_field(path: str, value: str | None) -> ComposeError:
    """A key that is not in the schema: name the group's fields closest to it."""
    known = schema_paths()
    parent, _, leaf = path.rpartition(".")
    siblings = [p.rpartition(".")[2] for p in known if p.rpartition(".")[0] == parent]
    if parent and siblings:
        hint = suggest(leaf, siblings)
        where = f"a field of {parent}"
    else:
        groups = sorted({p.split(".", 1)[0] for p in known} | {"recipe"})
        hint = suggest(path, known) or suggest(path.split(".", 1)[0], groups)
        where = f"a field path under one of {', '.join(groups)}"
    expected = f"{where}; {hint}" if hint else f"{where} (`kilocard show` prints every field)"
    return problem(path, "unknown field", value, expected)


def free_map_parent(path: str) -> str | None:
    """The free-form map (``cluster.env``...) that ``path`` is an entry of, if any."""
    parent = path.rpartition(".")[0]
    tp = _schema_types().get(parent)
    return parent if typing.get_origin(tp) in (dict, dict) else None


def _type_problem(key: str, text: str, value: str | None) -> ComposeError | None:
    expected = expected_for(key) or "a value of the field's type"
    if "is not Optional" in text:
        return problem(key, "cannot be null", value or "null", expected)
    m = re.search(r"Value '([^']*)'(?: of type '\w+')? could not be converted to (\w+)", text)
    if m:
        return problem(key, f"not a valid {m.group(2).lower()}", value if value is not None else m.group(1), expected)
    m = re.search(r"Value '([^']*)' is not a valid bool", text)
    if m:
        return problem(key, "not a valid bool", value if value is not None else m.group(1), expected)
    if re.search(r"Cannot (?:convert|assign) '?\w+'? to", text):
        return problem(key, "wrong kind of value", value, expected)
    return None


def _delete_problem(key: str, text: str) -> ComposeError | None:
    if "does not support deletion" in text:
        return problem(
            f"~{key}",
            "a schema field cannot be deleted",
            expected=f"a value instead, e.g. {key}=null where the field allows null; "
            "'~' removes map entries (~cluster.env.NAME) or whole config groups (~launcher)",
        )
    m = re.search(r"Could not delete from config. '([^']+)' does not exist", text)
    if m:
        return problem(f"~{m.group(1)}", "nothing to delete: the key is not set", expected="an existing key")
    return None


def _missing_option(text: str, group_options: Callable[[str], list[str]]) -> ComposeError | None:
    m = re.search(r"Could not find '([^']+)/([^'/]+)'", text)
    if not m:
        return None
    group, option = m.group(1), m.group(2)
    if group.startswith("recipes"):
        group = "recipe"
    opts = group_options(group)
    hint = suggest(option, opts)
    return problem(group, "no such option", option, f"one of {', '.join(opts)}" + (f"; {hint}" if hint else ""))


def explain(exc: BaseException, overrides: Sequence[str], group_options: Callable[[str], list[str]]) -> ComposeError:
    """Turn a Hydra/OmegaConf composition error into one line naming field, value, expectation."""
    cause = exc.__cause__ or exc.__context__
    text = f"{exc}\n{cause}" if cause is not None else str(exc)
    key = getattr(cause, "full_key", None) or getattr(exc, "full_key", None) or _override_key_in(text, overrides)
    found = _missing_option(text, group_options)
    if found is not None:
        return found
    if key:
        found = _delete_problem(key, text) or _type_problem(key, text, override_value(key, overrides))
        if found is not None:
            return found
    found = _delete_problem("", text)
    if found is not None:
        return found
    if "is not in struct" in text or re.search(r"Key '[^']+' (?:is )?not in", text):
        key = key or "?"
        value = override_value(key, overrides)
        parent = free_map_parent(key)
        if parent is not None:
            return problem(
                key, f"{key.rpartition('.')[2]!r} is not in {parent} yet", value, f"+{key}={value} to add it"
            )
        return unknown_field(key, value)
    first = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
    return ComposeError(f"{key + ': ' if key else ''}{first}", field=key)


def _override_key_in(text: str, overrides: Sequence[str]) -> str | None:
    for o in overrides:
        k = o.split("=", 1)[0].lstrip("+~")
        if k and k in text:
            return k
    return None
