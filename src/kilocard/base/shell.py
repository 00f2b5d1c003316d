"""Every value that reaches a batch script goes through here: quoted for the shell, or rejected.

Two places take config values in a batch script:
  * ``#SBATCH`` lines, which sbatch parses itself (no shell quoting there): only a conservative
    character set per kind of value is allowed (``sbatch_value``), anything else is rejected;
  * shell code (exports, the srun line): every value is single-quoted with ``shlex.quote``, and
    control characters (newline, NUL, carriage return...) are rejected first, so no value ever
    spans lines or executes (``$(...)``, backticks, ``;`` stay inert text).
Rejections raise ``ShellValueError`` naming the field, the value and the allowed form.
"""

from __future__ import annotations

import re
import shlex

#: Environment variable names.
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: Kinds of ``#SBATCH`` values and the characters each may hold.
SBATCH_PATTERNS = {
    "name": (re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*"), "letters, digits and . _ + - (e.g. llama3-70b)"),
    "path": (
        re.compile(r"/?[A-Za-z0-9._+%@=,:-][A-Za-z0-9._+%@=,:/-]*"),
        "an absolute path of letters, digits and . _ + - % @ = , : /",
    ),
    "time": (re.compile(r"(\d+-)?\d+(:\d{1,2}){0,2}"), "Slurm time: MINUTES, HH:MM:SS or D-HH:MM:SS (e.g. 04:00:00)"),
    "memory": (re.compile(r"\d+[KMGT]?"), "a size such as 0, 500G or 2000000M"),
    "dependency": (
        re.compile(r"[A-Za-z_]+(:[0-9_+*]+)*([,?][A-Za-z_]+(:[0-9_+*]+)*)*"),
        "a Slurm dependency such as afterany:123 or singleton",
    ),
}
#: An extra ``#SBATCH`` option: ``--flag`` or ``--flag=value`` with a safe value.
EXTRA_SBATCH = re.compile(r"--[a-z][a-z0-9-]*(=[A-Za-z0-9._+%@=,:/*-]+)?")
#: A container image reference as docker and enroot parse it: ``[host[:port]/]path[:tag][@algo:hex]``
#: (the grammar of the distribution/reference package, lower-case path components).
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_HOST = r"(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*(?::[0-9]+)?/)?"
IMAGE_REFERENCE = re.compile(
    _HOST + _COMPONENT + r"(?:/" + _COMPONENT + r")*(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?"
    r"(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?"
)
#: Characters no value may carry into a script: they would start a new line or truncate it.
CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")


class ShellValueError(ValueError):
    """A config value that cannot be put into a batch script safely."""

    def __init__(self, field: str, value: object, expected: str, into: str = "the batch script"):
        super().__init__(f"{field}: {value!r} cannot go into {into}; expected {expected}")
        self.field = field
        self.value = value


def quote(field: str, value: object) -> str:
    """``value`` as one shell word that never expands; control characters are rejected."""
    text = str(value)
    if CONTROL.search(text):
        raise ShellValueError(field, value, "a single line without control characters (no newline, tab is fine)")
    return shlex.quote(text)


def image_reference(field: str, value: str) -> str:
    """``value`` when it is a container image reference (``nvcr.io/nvidia/nemo:26.04``), else
    ``ShellValueError``: a reference is one word, so no shell metacharacter or newline passes."""
    if len(value) > 255 or not IMAGE_REFERENCE.fullmatch(value):
        raise ShellValueError(
            field,
            value,
            "an image reference [registry/]name[:tag][@sha256:...] (lower-case name, e.g. kilocard:1.0)",
            into="a Dockerfile or a docker command",
        )
    return value


def env_name(field: str, name: str) -> str:
    """``name`` when it is a valid environment variable name, else ``ShellValueError``."""
    if not ENV_NAME.fullmatch(str(name)):
        raise ShellValueError(
            field, name, "an environment variable name: letters, digits, _ (not starting with a digit)"
        )
    return str(name)


def sbatch_value(field: str, value: object, kind: str) -> str:
    """``value`` checked against the ``#SBATCH`` pattern of ``kind`` (``name``, ``path``, ``time``...)."""
    pattern, expected = SBATCH_PATTERNS[kind]
    text = str(value)
    if not pattern.fullmatch(text):
        raise ShellValueError(field, value, expected)
    return text


def extra_sbatch(field: str, option: str) -> str:
    """An ``extra_sbatch`` entry: ``--flag`` or ``--flag=value`` with a value of safe characters."""
    if not EXTRA_SBATCH.fullmatch(str(option)):
        raise ShellValueError(
            field, option, "--option or --option=value with letters, digits and . _ + % @ = , : / * -"
        )
    return str(option)


def optional_sbatch(field: str, value: object | None, kind: str) -> str | None:
    """``sbatch_value`` for a value that may be unset (``None`` or empty gives ``None``)."""
    if value is None or str(value) == "":
        return None
    return sbatch_value(field, value, kind)
