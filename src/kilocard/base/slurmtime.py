"""Slurm time limits (``MM``, ``MM:SS``, ``HH:MM:SS``, ``D-HH[:MM[:SS]]``) in seconds."""

from __future__ import annotations

from kilocard.base import shell


def time_to_seconds(field: str, value: str) -> int:
    """Slurm time (``MM``, ``HH:MM:SS``, ``D-HH[:MM[:SS]]``...) in seconds; ``ShellValueError`` if malformed."""
    text = shell.sbatch_value(field, value, "time")
    days, _, rest = text.rpartition("-")
    parts = [int(x) for x in rest.split(":")]
    if days:  # D-HH, D-HH:MM, D-HH:MM:SS
        parts += [0] * (3 - len(parts))
        return int(days) * 86400 + parts[0] * 3600 + parts[1] * 60 + parts[2]
    if len(parts) == 1:  # MM
        return parts[0] * 60
    if len(parts) == 2:  # MM:SS
        return parts[0] * 60 + parts[1]
    return parts[0] * 3600 + parts[1] * 60 + parts[2]


def time_limit_problem(text: str) -> str | None:
    """Why ``text`` is not a usable Slurm time limit, or ``None`` (minutes and seconds below 60, > 0)."""
    pattern, expected = shell.SBATCH_PATTERNS["time"]
    if not pattern.fullmatch(text):
        return f"not a Slurm time; expected {expected}"
    days, _, rest = text.rpartition("-")
    parts = [int(p) for p in rest.split(":")]
    if any(p >= 60 for p in parts[1:]):  # MM:SS, HH:MM:SS, D-HH:MM[:SS]: all but the first part
        return "minutes and seconds must be below 60"
    if int(days or 0) == 0 and all(p == 0 for p in parts):
        return "a time limit of 0 means none, and kilocard needs one to send USR1 before it"
    return None
