"""``kilocard baselines --site FILE --add RUN``: a run is one row by its identity, and the file is appended to in
place after it was checked.

Before: duplicates were keyed on the run directory's name (a symlink to a run added it twice, another run with the
same basename was refused), the file was rewritten (its comments dropped, though the docs say it appends), and a
row was appended to a file whose existing rows ``perf.site_baselines`` would then refuse.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from kilocard.calibration.baselines import load_rows
from kilocard.commands import main
from kilocard.config.compose import compose
from kilocard.rundir.freeze import write_frozen


def finished_run(path: Path, *overrides: str) -> Path:
    """A run directory with a frozen config and ten steps of metrics (steady state reached)."""
    path.mkdir(parents=True)
    write_frozen(compose(["recipe=tiny_gpt", *overrides]), path)
    records = [{"step": s, "step_time_s": 0.5, "tflops_per_gpu": 1.0 + s / 100, "loss": 5.0} for s in range(1, 11)]
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def add(site: Path, run: Path) -> int:
    return main(["baselines", "--site", str(site), "--add", str(run)])


def test_a_symlink_to_a_run_does_not_add_it_twice(tmp_path, capsys):
    run = finished_run(tmp_path / "runs" / "r1")
    (tmp_path / "alias").symlink_to(run, target_is_directory=True)
    site = tmp_path / "site.yaml"
    assert add(site, run) == 0
    before = site.read_bytes()
    assert add(site, tmp_path / "alias") == 2
    assert "already holds this run as row 'site-r1'" in capsys.readouterr().err
    assert site.read_bytes() == before and len(load_rows(str(site))) == 1


def test_another_run_with_the_same_directory_name_is_its_own_row(tmp_path, capsys):
    site = tmp_path / "site.yaml"
    assert add(site, finished_run(tmp_path / "a" / "run")) == 0
    assert add(site, finished_run(tmp_path / "b" / "run", "trainer.seed=7")) == 0
    ids = [r.id for r in load_rows(str(site))]
    assert len(ids) == 2 == len(set(ids)) and ids[0] == "site-run" and ids[1].startswith("site-run-")
    assert f"added {ids[1]} to {site}" in capsys.readouterr().out


@pytest.mark.parametrize("indent", [0, 2])
def test_the_file_is_appended_in_place_with_its_comments(indent, tmp_path):
    site = tmp_path / "site.yaml"
    assert add(site, finished_run(tmp_path / "runs" / "r1")) == 0
    rows = yaml.safe_load(site.read_text())["rows"]
    pad = " " * indent
    item = "".join(pad + line for line in yaml.safe_dump(rows, sort_keys=False).splitlines(keepends=True))
    mine = f"# our cluster, measured by the platform team\n# keep this header\nrows:\n{item}# the next rows: Dec runs\n"
    site.write_text(mine)
    assert add(site, finished_run(tmp_path / "runs" / "r2", "trainer.seed=7")) == 0
    text = site.read_text()
    assert text.startswith(mine) and [r.id for r in load_rows(str(site))] == ["site-r1", "site-r2"]


def test_a_malformed_file_is_refused_before_anything_is_appended(tmp_path, capsys):
    site = tmp_path / "site.yaml"
    site.write_text("# mine\nrows:\n- id: broken\n  result: {tflops_per_gpu: 1.0}\n")  # no source: the loader refuses
    before = site.read_bytes()
    assert add(site, finished_run(tmp_path / "runs" / "r1")) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"kilocard baselines: error: --site: row broken of {site.name} has no 'source'"), err
    assert "fix the file first" in err and len(err.strip().splitlines()) == 1
    assert site.read_bytes() == before and not list(tmp_path.glob(".site.yaml.tmp-*"))


def test_rows_not_last_in_the_file_are_refused_not_rewritten(tmp_path, capsys):
    site = tmp_path / "site.yaml"
    assert add(site, finished_run(tmp_path / "runs" / "r1")) == 0
    site.write_text(site.read_text() + "notes: kept last\n")
    before = site.read_bytes()
    assert add(site, finished_run(tmp_path / "runs" / "r2", "trainer.seed=7")) == 2
    assert "cannot be appended in place" in capsys.readouterr().err and site.read_bytes() == before


def _add_after(barrier, site: Path, run: Path, codes) -> None:
    import contextlib
    import io

    barrier.wait()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        codes.put((run.name, add(site, run)))


def test_concurrent_adds_each_land_once(tmp_path):
    """Runs added to one site file at the same moment (jobs ending together, each adding itself): every add
    reads the rows, appends and renames; one at a time, so no row is lost and none is refused for what another
    writer left half-read."""
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    runs = [finished_run(tmp_path / "runs" / f"r{i}") for i in range(8)]
    site = tmp_path / "site.yaml"
    add(site, finished_run(tmp_path / "runs" / "first"))  # the file exists: every add below reads and appends
    barrier, codes = ctx.Barrier(len(runs)), ctx.Queue()
    procs = [ctx.Process(target=_add_after, args=(barrier, site, run, codes)) for run in runs]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert sorted(codes.get(timeout=5) for _ in runs) == [(f"r{i}", 0) for i in range(8)]
    assert sorted(r.id for r in load_rows(str(site))) == ["site-first", *(f"site-r{i}" for i in range(8))]
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary file left
