"""``PROFILE_STEPS``: ``trainer.profile_steps`` is empty or a window [a, b] inside 1..train_iters."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from kilocard.config.compose import compose
from kilocard.validate import validate


def _codes(*overrides: str) -> list[str]:
    cfg = OmegaConf.to_object(compose(["recipe=tiny_gpt", "trainer.train_iters=10", *overrides]))
    return [i.code for i in validate(cfg).issues if i.field == "trainer.profile_steps"]


@pytest.mark.parametrize("steps", ["[]", "[1,1]", "[2,10]"])
def test_a_window_inside_the_run_is_accepted(steps: str) -> None:
    assert _codes(f"trainer.profile_steps={steps}") == []


@pytest.mark.parametrize("steps", ["[0,2]", "[3,2]", "[2,11]", "[2]", "[1,2,3]"])
def test_anything_else_is_refused_naming_the_field(steps: str) -> None:
    assert _codes(f"trainer.profile_steps={steps}") == ["PROFILE_STEPS"]


def test_nsys_needs_a_window_to_capture() -> None:
    cfg = OmegaConf.to_object(compose(["recipe=tiny_gpt", "trainer.nsys=true"]))
    (issue,) = [i for i in validate(cfg).issues if i.field == "trainer.nsys"]
    assert issue.code == "NSYS_WINDOW" and "trainer.profile_steps=[a,b]" in issue.hint
    ok = OmegaConf.to_object(compose(["recipe=tiny_gpt", "trainer.nsys=true", "trainer.profile_steps=[2,3]"]))
    assert not [i for i in validate(ok).issues if i.field == "trainer.nsys"]
