"""Every invalid input in tests/corpus/invalid_inputs.yaml is refused by `kilocard validate`,
`kilocard sbatch --submit` and `kilocard run` before anything is written or submitted.

For each entry and each verb: a non-zero exit, the entry's field named in the output, no
traceback, no run directory under the temporary ``cluster.shared_fs``, no ``sbatch`` call.
The whole corpus goes through the real CLI (``kilocard.cli.main``) in one child process (one
Python start-up instead of 240); one entry per verb (of three different kinds) also goes
through the installed ``kilocard`` console script. ``sbatch`` on the PATH is a sentinel script that
records any call: a submission is the thing that must not happen, so nothing real is needed
to answer it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

CORPUS_FILE = Path(__file__).parents[1] / "corpus" / "invalid_inputs.yaml"
CORPUS = yaml.safe_load(CORPUS_FILE.read_text())
VERBS = (["validate"], ["sbatch", "--submit"], ["run"])
KILOCARD = Path(sys.executable).with_name("kilocard")

DRIVER = r"""
import contextlib, io, json, sys, traceback
from kilocard.cli import main
corpus, root = json.load(open(sys.argv[1])), sys.argv[2]
results = []
for entry in corpus:
    for verb in json.loads(sys.argv[3]):
        out = io.StringIO()
        argv = [*verb, "recipe=tiny_gpt", f"cluster.shared_fs={root}", *entry["overrides"]]
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            try:
                rc = main(argv)
            except SystemExit as e:
                rc = e.code
            except BaseException:
                traceback.print_exc()
                rc = "exception"
        results.append({"verb": verb[0], "overrides": entry["overrides"], "field": entry["field"],
                        "rc": rc, "out": out.getvalue()})
json.dump(results, open(sys.argv[4], "w"))
"""


@pytest.fixture
def guarded(tmp_path):
    """(shared_fs root, environment with a sentinel ``sbatch`` first on PATH, sentinel's record file)."""
    root, bin_dir, record = tmp_path / "shared", tmp_path / "bin", tmp_path / "sbatch-calls"
    root.mkdir()
    bin_dir.mkdir()
    sentinel = bin_dir / "sbatch"
    sentinel.write_text(f'#!/bin/sh\necho "$@" >> {record}\necho 4242\n')
    sentinel.chmod(0o755)
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "OMP_NUM_THREADS": "1",
        "TMPDIR": str(tmp_path),
        "KILOCARD_CACHE_DIR": str(tmp_path / "cache"),
    }
    return root, env, record


def refusal_problems(result) -> list:
    """What is wrong with one verb's answer to one invalid entry (empty when it refused properly)."""
    problems = []
    if result["rc"] in (0, None, "exception"):
        problems.append(f"exit {result['rc']}")
    if "Traceback" in result["out"]:
        problems.append("traceback")
    if result["field"] not in result["out"]:
        problems.append(f"field {result['field']} not named")
    return problems


def assert_nothing_written(root: Path, record: Path) -> None:
    assert sorted(p.name for p in root.iterdir()) == [], "a run directory was written"
    assert not record.exists(), f"sbatch was called: {record.read_text()}"


def test_corpus_is_big_and_covers_every_kind():
    kinds = {e["kind"] for e in CORPUS}
    assert len(CORPUS) >= 60
    assert kinds == {"layout", "batch", "precision", "topology", "launcher", "path", "shell", "range", "type"}
    assert len({json.dumps(e["overrides"]) for e in CORPUS}) == len(CORPUS), "duplicate entries"


@pytest.mark.integration  # runs the kilocard console script
def test_every_invalid_input_is_refused_by_every_verb(guarded, tmp_path):
    root, env, record = guarded
    corpus_json, results_json = tmp_path / "corpus.json", tmp_path / "results.json"
    corpus_json.write_text(json.dumps(CORPUS))
    proc = subprocess.run(
        [sys.executable, "-c", DRIVER, str(corpus_json), str(root), json.dumps(VERBS), str(results_json)],
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(results_json.read_text())
    assert len(results) == len(CORPUS) * len(VERBS)
    bad = [(r["verb"], r["overrides"], refusal_problems(r), r["out"][-400:]) for r in results if refusal_problems(r)]
    assert not bad, "\n".join(map(str, bad))
    assert_nothing_written(root, record)


@pytest.mark.integration  # runs the kilocard console script
def test_console_script_refuses_with_one_line(guarded):
    root, env, record = guarded
    picks = {"shell": VERBS[0], "range": VERBS[1], "path": VERBS[2]}
    bad = []
    for kind, verb in picks.items():
        entry = next(e for e in CORPUS if e["kind"] == kind)
        argv = [str(KILOCARD), *verb, "recipe=tiny_gpt", f"cluster.shared_fs={root}", *entry["overrides"]]
        p = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
        result = {"rc": p.returncode, "out": p.stdout + p.stderr, "field": entry["field"]}
        if refusal_problems(result):
            bad.append((verb, entry["overrides"], refusal_problems(result), result["out"][-400:]))
    assert not bad, "\n".join(map(str, bad))
    assert_nothing_written(root, record)
