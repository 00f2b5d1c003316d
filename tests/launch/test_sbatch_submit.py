"""``kilocard sbatch --submit`` when submitting goes wrong: a chain too long, no ``sbatch`` client,
a chain whose third link Slurm refuses.

The ``sbatch``/``scancel`` here are stand-ins on the PATH (a mock): a real controller cannot be
made to refuse exactly the third of five submissions on demand, and what is tested is kilocard's
answer to that refusal (cancel the queued links, or record them), not Slurm. The real controller's
side of chains is in tests/launch/test_slurm_e2e.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kilocard.commands import exits, main
from kilocard.launch.slurm import MAX_CHAIN

TINY = ["recipe=tiny_gpt", "cluster.nodes=2", "cluster.gpus_per_node=2", "launcher.signal_lead_s=60"]

FAKE_SBATCH = """#!/bin/sh
n=$(( $(cat {state} 2>/dev/null || echo 0) + 1 )); echo $n > {state}
echo "$@" >> {log}
if [ $n -eq {fail_on} ]; then
  echo "sbatch: error: Batch job submission failed: Job violates accounting/QOS policy" >&2; exit 1
fi
echo $(( 100 + n ))
"""
FAKE_SCANCEL = """#!/bin/sh
echo "$@" >> {log}
exit {code}
"""


@pytest.fixture
def slurm_bin(tmp_path, monkeypatch):
    """Stand-in ``sbatch`` (fails on call ``fail_on``) and ``scancel`` first on the PATH; returns a setup function."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    logs = {"sbatch": tmp_path / "sbatch.log", "scancel": tmp_path / "scancel.log"}

    def setup(fail_on: int = 0, scancel_code: int = 0) -> dict[str, Path]:
        sbatch = FAKE_SBATCH.format(state=tmp_path / "n", log=logs["sbatch"], fail_on=fail_on)
        (bin_dir / "sbatch").write_text(sbatch)
        (bin_dir / "scancel").write_text(FAKE_SCANCEL.format(log=logs["scancel"], code=scancel_code))
        for f in bin_dir.iterdir():
            f.chmod(0o755)
        monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
        return logs

    return setup


def run_sbatch(args, capsys):
    rc = main(["sbatch", *args])
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.mark.parametrize("chain", [MAX_CHAIN + 1, 10000])
def test_chain_beyond_the_cap_is_refused_before_anything(chain, tmp_path, slurm_bin, capsys):
    """``--chain 10000`` once queued 10,000 jobs: now one line naming the cap; nothing written or submitted."""
    logs = slurm_bin()
    rc, out, err = run_sbatch([*TINY, f"cluster.shared_fs={tmp_path}/runs", "--submit", "--chain", str(chain)], capsys)
    assert rc == exits.USAGE and out == ""
    assert err.strip() == (
        f"kilocard sbatch: error: --chain: {chain} is not a usable number of links; use 1 to {MAX_CHAIN} "
        "(each link is a queued job); nothing written, nothing submitted"
    )
    assert not (tmp_path / "runs").exists() and not logs["sbatch"].exists()


def test_chain_at_the_cap_is_written(tmp_path, capsys):
    rc, out, err = run_sbatch([*TINY, f"cluster.shared_fs={tmp_path}", "--chain", str(MAX_CHAIN)], capsys)
    assert rc == exits.OK, err
    assert f"(x{MAX_CHAIN}, chained afterany)" in out


def test_submit_without_sbatch_writes_nothing(tmp_path, monkeypatch, capsys):
    """No ``sbatch`` on the PATH: refused before the run directory is written (it used to be written first)."""
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    rc, out, err = run_sbatch([*TINY, f"cluster.shared_fs={tmp_path}/runs", "--submit"], capsys)
    assert rc == exits.INVALID and out == ""
    assert "sbatch: not found on the PATH" in err and "nothing written, nothing submitted" in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not (tmp_path / "runs").exists()


def test_chain_broken_at_link_3_cancels_the_queued_links(tmp_path, slurm_bin, capsys):
    """Links 1-2 queued, link 3 refused: 1-2 are cancelled with scancel, exit 1, no job left unaccounted."""
    logs = slurm_bin(fail_on=3)
    rc, out, err = run_sbatch([*TINY, f"cluster.shared_fs={tmp_path}/runs", "--submit", "--chain", "5"], capsys)
    assert rc == exits.INVALID
    assert len(logs["sbatch"].read_text().splitlines()) == 3  # nothing submitted after the refusal
    assert logs["scancel"].read_text().split() == ["101", "102"]
    assert "link 3 of 5" in err and "Job violates accounting/QOS policy" in err
    assert "cancelled the 2 link(s) already queued (101 102): nothing is queued" in err
    run_dir = next((tmp_path / "runs").iterdir())
    assert (run_dir / "submit.sbatch").exists() and not (run_dir / "jobs.json").exists()


def test_chain_broken_and_cancel_failing_records_the_queued_links(tmp_path, slurm_bin, capsys):
    """When scancel fails too, the queued links are recorded in jobs.json (marked incomplete) and named."""
    slurm_bin(fail_on=3, scancel_code=1)
    rc, out, err = run_sbatch([*TINY, f"cluster.shared_fs={tmp_path}/runs", "--submit", "--chain", "5"], capsys)
    assert rc == exits.INVALID
    run_dir = next((tmp_path / "runs").iterdir())
    jobs = json.loads((run_dir / "jobs.json").read_text())
    assert jobs["job_ids"] == [101, 102] and jobs["submissions"][0]["complete"] is False
    assert "could not cancel the 2 link(s)" in err and "run `scancel 101 102`" in err
    assert len(err.strip().splitlines()) == 1


def test_whole_chain_is_recorded(tmp_path, slurm_bin, capsys):
    slurm_bin()
    rc, out, err = run_sbatch([*TINY, f"cluster.shared_fs={tmp_path}/runs", "--submit", "--chain", "3"], capsys)
    assert rc == exits.OK, err
    assert "job ids: 101 102 103" in out
    jobs = json.loads((next((tmp_path / "runs").iterdir()) / "jobs.json").read_text())
    assert jobs["job_ids"] == [101, 102, 103] and "complete" not in jobs["submissions"][0]


def test_chain_broken_with_a_latin1_message_cancels_the_queued_links(tmp_path, slurm_bin, capsys):
    """A site's job_submit plugin answering in latin-1 (``refusé``) was a UnicodeDecodeError traceback
    after links 1-2 were queued, which then stayed queued and unrecorded."""
    logs = slurm_bin(fail_on=3)
    sbatch = tmp_path / "bin" / "sbatch"
    sbatch.write_text(
        sbatch.read_text().replace(
            'echo "sbatch: error: Batch job submission failed: Job violates accounting/QOS policy" >&2',
            "printf 'sbatch: error: soumission refus\\351e\\n' >&2",
        )
    )
    rc, out, err = run_sbatch([*TINY, f"cluster.shared_fs={tmp_path}/runs", "--submit", "--chain", "5"], capsys)
    assert rc == exits.INVALID and len(err.strip().splitlines()) == 1, err
    assert "link 3 of 5" in err and "soumission refus\ufffde" in err
    assert logs["scancel"].read_text().split() == ["101", "102"]
    assert "cancelled the 2 link(s) already queued (101 102): nothing is queued" in err
