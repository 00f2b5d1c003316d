"""The docs state one figure for the calibration rows, the code's: every "N published rows" in README.md and
docs/*.md is the number of rows ``baselines/published.yaml`` lists, every "N scored rows" the number scored,
every "N listed but not scored" their difference. A row added to the file fails this test until the pages
say the new figure (historical tables that say "114 | ..." are not sentences of this form and are left be).
"""

from __future__ import annotations

import re

import pytest
from docblocks import ROOT, doc_pages

from kilocard.calibration.baselines import load_rows

#: "124 published rows" (not "20 published rows from 7 sources like this run": a subset the CLI prints).
PUBLISHED = re.compile(r"(\d[\d,]*) published (?:rows|runs)(?! from \d+ sources? like)")
SCORED = re.compile(r"(\d[\d,]*) scored(?: rows?)?\b")
UNSCORED = re.compile(r"(\d[\d,]*) listed but not scored")


def figures() -> dict[re.Pattern[str], int]:
    rows = load_rows()
    scored = sum(r.complete for r in rows)
    return {PUBLISHED: len(rows), SCORED: scored, UNSCORED: len(rows) - scored}


@pytest.mark.parametrize("page", [p.relative_to(ROOT).as_posix() for p in doc_pages()])
def test_every_calibration_row_count_is_the_codes(page):
    text = (ROOT / page).read_text()
    wrong = [
        f"{page}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(0)!r}, the code says {want}"
        for pattern, want in figures().items()
        for m in pattern.finditer(text)
        if int(m.group(1).replace(",", "")) != want
    ]
    assert not wrong, "\n".join(wrong)


def test_the_readme_states_both_figures():
    text = (ROOT / "README.md").read_text()
    assert PUBLISHED.search(text) and SCORED.search(text)


def readme_recipe_table() -> list[tuple[list[str], list[str]]]:
    """(families, recipe names or glob patterns) of each row of README.md's recipe table."""
    lines = (ROOT / "README.md").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| family | recipes |"))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        family, recipes = line.split("|")[1:3]
        rows.append((re.findall(r"`([^`]+)`", family), re.findall(r"`([^`]+)`", recipes)))
    return rows


def test_every_recipe_is_in_the_readmes_recipe_table():
    """Each shipped recipe is named (or matched by a pattern such as ``bridge_llama3_*_fp8``) in the row of
    its family (``recipes/<family>/``)."""
    from fnmatch import fnmatchcase

    from kilocard.config.compose import recipe_catalog

    table = readme_recipe_table()
    missing = [
        f"{path.parent.name}/{name}"
        for name, path in sorted(recipe_catalog().items())
        if not any(path.parent.name in fams and any(fnmatchcase(name, p) for p in pats) for fams, pats in table)
    ]
    assert not missing, f"not in README.md's recipe table (family row, name or pattern): {', '.join(missing)}"
