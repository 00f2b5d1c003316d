"""Every config in tests/corpus/bad_configs.yaml, composed as a user types it, is rejected with
the listed issue code naming the listed field; and the shipped tiny recipes pass."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from kilocard.config.compose import compose_each, to_run_config
from kilocard.validate import validate

CORPUS = yaml.safe_load((Path(__file__).parents[1] / "corpus" / "bad_configs.yaml").read_text())


def test_corpus_is_big_and_each_entry_is_rejected_for_its_reason():
    assert len(CORPUS) >= 40
    cfgs = compose_each([e["overrides"] for e in CORPUS])
    wrong = []
    for entry, cfg in zip(CORPUS, cfgs, strict=False):
        report = validate(to_run_config(cfg))
        hits = [i for i in report.errors if i.code == entry["code"] and i.field == entry["field"]]
        if report.valid or not hits:
            wrong.append((entry["overrides"], entry["code"], [(i.code, i.field) for i in report.errors]))
        for i in report.issues:
            assert i.message and i.hint and i.field, i
    assert not wrong, "\n".join(map(str, wrong))
    print(f"{len(CORPUS)} bad configs rejected with the right code and field")


@pytest.mark.parametrize("recipe", ["tiny_gpt", "tiny_moe"])
def test_tiny_recipes_are_valid(recipe):
    report = validate(to_run_config(compose_each([[f"recipe={recipe}"]])[0]))
    assert report.valid, [(i.code, i.message) for i in report.issues]
