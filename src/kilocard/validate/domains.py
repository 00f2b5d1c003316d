"""``rule_field_domains``: every field inside its domain (``kilocard.config.domains.DOMAINS``, one table).

``validate`` runs it first: a field outside its domain is reported once, by this rule, with the table's
code (another rule's issue on the same field is left out), and nothing is estimated from such a config.
The concern modules check what one field alone cannot say (how fields relate, what the hardware has)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from kilocard.config.domains import DOMAINS, Choices, Range, exposed_fields, outside
from kilocard.config.schema import RunConfig
from kilocard.layout import Layout
from kilocard.validate.issues import Issue, error

DEFAULTS: dict[str, Any] = dict(exposed_fields())
"""Each exposed field's schema default (the fix a message proposes)."""


def fix(field: str) -> str:
    """The override that brings ``field`` back into its domain (its default where that is inside)."""
    domain, default = DOMAINS[field], DEFAULTS.get(field)
    if isinstance(domain, Choices):
        return f"set {field} to one of {domain.text()}"
    if isinstance(domain, Range) and default is not None and not isinstance(default, list):
        return f"set {field} to a value in {domain.text()} (the default is {default})"
    return f"set {field} to a value in {domain.text() if isinstance(domain, Range) else 'its domain'}"


def rule_field_domains(cfg: RunConfig, lay: Layout) -> Iterable[Issue]:
    """Each field of ``DOMAINS`` holds a value of its range or choices (null allowed where the schema allows it)."""
    for field, value, why in outside(cfg):
        domain = DOMAINS[field]
        code = domain.code if isinstance(domain, (Range, Choices)) else "OUT_OF_RANGE"
        yield error(code, field, value, f"{field}={value!r} {why}", fix(field))
