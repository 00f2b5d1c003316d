"""The domain table (``kilocard.config.domains``) covers every exposed field, and validate holds to it.

A new schema field without a row in ``DOMAINS`` fails ``test_every_exposed_field_has_a_domain``; each row's
edges are then walked through ``validate``: a value just outside is refused naming the field, the default
is inside."""

from __future__ import annotations

import dataclasses
import math

import pytest

from kilocard.config.domains import DOMAINS, Choices, Range, Text, exposed_fields, problem
from kilocard.config.schema import RunConfig
from kilocard.validate import validate
from kilocard.validate.domains import DEFAULTS

pytestmark = pytest.mark.unit

FIELDS = [name for name, _ in exposed_fields()]


def test_every_exposed_field_has_a_domain():
    missing = [f for f in FIELDS if f not in DOMAINS]
    assert not missing, f"add a row to kilocard.config.domains for: {missing}"
    stale = [f for f in DOMAINS if f not in FIELDS]
    assert not stale, f"rows for fields the schema no longer has: {stale}"


def test_numbers_have_ranges_and_strings_choices_or_a_named_rule():
    """A whole-number field has a finite top; a number has a Range; free text says which rule checks it."""
    for section in dataclasses.fields(RunConfig()):
        for f in dataclasses.fields(getattr(RunConfig(), section.name)):
            name, domain = f"{section.name}.{f.name}", DOMAINS.get(f"{section.name}.{f.name}")
            kind = str(f.type)
            if kind.startswith(("int", "float")) or "int" in kind.split(" | ")[0]:
                assert isinstance(domain, Range), name
                if kind.startswith("int"):
                    assert domain.high is not None and math.isfinite(domain.high), name
            if isinstance(domain, Text):
                assert domain.what, name


@pytest.mark.parametrize("field", [f for f in FIELDS if not isinstance(DOMAINS[f], Text)])
def test_default_inside_and_edges_refused_by_validate(field):
    """The schema default lies inside; one step outside either end (or an unknown choice) is a validate
    error on that very field, before any estimate."""
    default, domain = DEFAULTS[field], DOMAINS[field]
    assert problem(domain, default) is None, (field, default)
    for bad in outside_values(domain, default):
        report = validate(with_value(field, bad))
        named = [i for i in report.errors if i.field.partition("[")[0] == field]
        assert named, (field, bad, report.codes())
        assert named[0].code == domain.code and report.estimates.memory is None


def outside_values(domain, default):
    if isinstance(domain, Choices):
        return [["not-a-choice"] if isinstance(default, list) else "not-a-choice"]
    out = []
    step = 1 if isinstance(domain.low, int) and (domain.high is None or isinstance(domain.high, int)) else None
    out.append(domain.low if domain.low_open else domain.low - (step or max(abs(domain.low) * 0.5, 1e-3)))
    if domain.high is not None:
        out.append(domain.high if domain.high_open else domain.high + (step or max(abs(domain.high), 1.0)))
    if isinstance(default, list):
        return [[v] for v in out]
    return [int(v) if isinstance(default, int) or default is None and step else v for v in out]


def with_value(field, value):
    section, name = field.split(".")
    cfg = RunConfig()
    return dataclasses.replace(cfg, **{section: dataclasses.replace(getattr(cfg, section), **{name: value})})
