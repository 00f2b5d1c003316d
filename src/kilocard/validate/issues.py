"""What the validator reports: ``Issue`` (one problem) and ``Report`` (all of them + estimates)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from kilocard.layout import Layout
from kilocard.validate.estimates import Estimates

ERROR, WARNING = "error", "warning"


@dataclass(frozen=True)
class Issue:
    """One problem with a config."""

    severity: str
    """``error`` (the run would fail or be wrong) or ``warning`` (it runs, but see the message)."""
    code: str
    """Stable identifier, e.g. ``TP_HEADS`` (scripts match on it)."""
    field: str
    """Dotted path of the field to change, e.g. ``parallel.tensor_model_parallel_size``."""
    value: Any
    """That field's current value."""
    message: str
    """What is wrong, with every factor printed."""
    hint: str
    """How to fix it (override lines where possible)."""

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict with the six keys."""
        return {
            "severity": self.severity,
            "code": self.code,
            "field": self.field,
            "value": _jsonable(self.value),
            "message": self.message,
            "hint": self.hint,
        }


def error(code: str, field: str, value: Any, message: str, hint: str) -> Issue:
    """An ``error`` issue."""
    return Issue(ERROR, code, field, value, message, hint)


def warning(code: str, field: str, value: Any, message: str, hint: str) -> Issue:
    """A ``warning`` issue."""
    return Issue(WARNING, code, field, value, message, hint)


def _jsonable(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)  # JSON has no nan/inf
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    return str(v)


@dataclass
class Report:
    """Everything the validator found about one config."""

    issues: list[Issue]
    """Every problem, errors and warnings, in rule order."""
    layout: Layout
    """The parallel layout the config implies."""
    estimates: Estimates = field(default_factory=Estimates)
    """Memory per GPU against HBM, FLOPs per iteration, the prediction (JSON: ``estimates.to_json()``)."""

    @property
    def valid(self) -> bool:
        """True when no issue is an error (warnings allowed)."""
        return not any(i.severity == ERROR for i in self.issues)

    @property
    def errors(self) -> list[Issue]:
        """The error issues."""
        return [i for i in self.issues if i.severity == ERROR]

    def codes(self) -> list[str]:
        """Issue codes in order."""
        return [i.code for i in self.issues]

    def to_dict(self) -> dict[str, Any]:
        """The stable JSON object: ``valid``, ``issues``, ``layout``, ``estimates``."""
        return {
            "valid": self.valid,
            "issues": [i.to_json() for i in self.issues],
            "layout": self.layout.to_json(),
            "estimates": _jsonable(self.estimates.to_json()),
        }

    def to_json(self, indent: int | None = 2) -> str:
        """``to_dict`` as JSON text."""
        return json.dumps(self.to_dict(), indent=indent)
