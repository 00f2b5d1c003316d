"""One exit-code table (``kilocard.exitcodes.TABLE``): the batch script, the run summary and the docs
take every code's name from it, so no copy can lose a code (BAD_NODE 77 once was missing from two)."""

from __future__ import annotations

import re
from pathlib import Path

from kilocard import exitcodes
from kilocard.config.compose import compose, to_run_config
from kilocard.launch.render import render_script
from kilocard.paths import data_dir
from kilocard.plan import build_plan
from kilocard.rundir.progress import summary_table

DOCS = Path(__file__).parents[2] / "docs"


def _script(*overrides: str) -> str:
    cfg = to_run_config(compose(["recipe=tiny_gpt", "launcher=slurm", "cluster.venv=/opt/venv", *overrides]))
    return render_script(cfg, build_plan(cfg), Path("/shared/runs/x"))


def test_table_rows_are_the_module_constants_and_every_code_once():
    assert [getattr(exitcodes, row.name) for row in exitcodes.TABLE] == [row.code for row in exitcodes.TABLE]
    codes = [row.code for row in exitcodes.TABLE]
    assert len(set(codes)) == len(codes)
    assert set(codes) == exitcodes.RETRYABLE | exitcodes.NO_RETRY | {exitcodes.DONE}


def test_template_holds_no_code_of_its_own():
    text = (data_dir("slurm") / "train.sbatch.tmpl").read_text()
    assert not re.findall(r"\bEXIT_[A-Z]+=\d", text)
    assert not re.search(r"^#\s+\d+\s+[A-Z_]{4,}\s", text, re.M)  # the contract's rows are rendered


def test_script_variables_and_comment_rows_come_from_the_table():
    for in_job, script in ((False, _script()), (True, _script("launcher.max_restarts=2"))):
        found = {name: int(v) for name, v in re.findall(r"\bEXIT_([A-Z_]+)=(\d+)", script)}
        assert found == {name: getattr(exitcodes, name) for name in ("DONE", "BUSY", "RETRY", "FAULT")}
        rows = {int(m[0]): m[1] for m in re.findall(r"^#   (\d+) +([A-Z_]+) ", script, re.M)}
        expected = {row.code: row.name for row in exitcodes.TABLE}
        if not in_job:  # without in-job restarts no rank ends BAD_NODE
            del expected[exitcodes.BAD_NODE]
        assert rows == expected


def test_run_summary_names_every_code_bad_node_included(tmp_path):
    for row in exitcodes.TABLE:
        text = summary_table([], tmp_path, row.code, ckpt_root=tmp_path)
        exit_line = next(line for line in text.splitlines() if line.startswith("exit"))
        assert exit_line.split()[1:3] == [str(row.code), row.name], exit_line
    assert "77 BAD_NODE" in summary_table([], tmp_path, 77, ckpt_root=tmp_path)


def test_docs_list_every_code_of_the_table():
    assert exitcodes.listing() in " ".join((DOCS / "faults.md").read_text().split())
