"""Every bad command line in tests/corpus/bad_cli.yaml gets its exit code and one clear error.

In-process through ``kilocard.commands.main`` (argparse's own refusals exit 2 through
``SystemExit``), with a sentinel ``sbatch`` first on the PATH that records any call: a submission
is what must not happen, so nothing real is needed to answer it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from kilocard.commands import main

CORPUS = yaml.safe_load((Path(__file__).parents[1] / "corpus" / "bad_cli.yaml").read_text())


@pytest.fixture
def sentinel(tmp_path, monkeypatch):
    """(shared_fs root, record of sbatch calls)."""
    bin_dir, record = tmp_path / "bin", tmp_path / "sbatch-calls"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text(f'#!/bin/sh\necho "$@" >> {record}\necho 4242\n')
    (bin_dir / "sbatch").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    return tmp_path / "shared", record


@pytest.mark.parametrize("entry", CORPUS, ids=lambda e: " ".join(e["argv"])[:60])
def test_bad_command_line_is_refused(entry, sentinel, capsys):
    root, record = sentinel
    damaged = root.parent / "damaged-run"  # a run directory whose events.jsonl was edited by hand
    damaged.mkdir()
    (damaged / "events.jsonl").write_text('{"event": "start", "time": 1.0}\n{"event": oops\n')
    argv = [a.replace("{long}", "x" * 300).replace("{damaged_run}", str(damaged)) for a in entry["argv"]]
    if argv[0] in ("sbatch", "run") and not any(a.startswith("--resume") for a in argv):
        argv.append(f"cluster.shared_fs={root}")
    try:
        rc = main(argv)
    except SystemExit as e:
        rc = e.code
    out, err = capsys.readouterr()
    assert rc == entry["exit"], (out, err)
    assert entry["says"] in out + err and "Traceback" not in out + err
    assert not root.exists() and not record.exists()
