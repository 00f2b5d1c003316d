"""``validate`` reports every refusal ``run`` and ``sbatch`` make before launching (``kilocard.launch.refusals``).

For each launch-time check of the one list, and each verb that makes it, a config that trips it: the verb
refuses it (its exit code, nothing written) and ``kilocard validate`` of the same overrides lists the same
code, an error where the config's launcher is that verb's (a Slurm config's site checks are warnings:
validate may run on a laptop). The test fails when a check is added to the list without a case here. All
real: real composition, the real machine (no GPU, no wandb), real paths; only NVRx, which this venv has,
is made absent by pointing its module name at one that does not exist.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from kilocard.commands import main
from kilocard.launch import ftlaunch, refusals
from kilocard.validate.packages import importable

SECRET = "KC_REFUSALS_TEST_UNSET_SECRET"


def cases(tmp: Path) -> dict[tuple[str, str], tuple[list[str], int]]:
    """``(code, verb)`` -> (overrides that trip the check, the verb's exit code)."""
    tiny = ["recipe=tiny_gpt", f"cluster.shared_fs={tmp}/runs"]
    ranks = 2 * (os.cpu_count() or 1) + 2  # more CPU ranks than this machine carries
    return {
        ("RUN_HERE", "run"): ([*tiny, "cluster.nodes=2"], 2),
        ("RESTARTS_UNAVAILABLE", "run"): ([*tiny, "launcher.max_restarts=1"], 2),
        ("RUN_ROOT", "run"): (["recipe=tiny_gpt", f"cluster.shared_fs={tmp}/no/such/runs"], 2),
        ("RUN_ROOT", "sbatch"): (["recipe=tiny_gpt", f"cluster.shared_fs={tmp}/no/such/runs"], 2),
        ("PACKAGE_MISSING", "run"): ([*tiny, "trainer.wandb=true"], 1),
        ("CPU_RANKS", "run"): ([*tiny, f"cluster.gpus_per_node={ranks}", f"launcher.nproc={ranks}"], 1),
        ("SBATCH_VALUE", "sbatch"): (["recipe=tiny_gpt", f"cluster.shared_fs={tmp}/my runs"], 1),
        ("SECRET_NOT_SET", "run"): ([*tiny, f"launcher.secret_env=[{SECRET}]"], 2),
        ("SECRET_NOT_SET", "sbatch"): ([*tiny, f"launcher.secret_env=[{SECRET}]"], 1),
    }


def test_every_launch_check_has_a_case():
    assert set(cases(Path("/x"))) == {(c.code, verb) for c in refusals.CHECKS for verb in c.verbs}


@pytest.mark.parametrize("key", sorted(cases(Path("/x"))), ids=lambda k: f"{k[0]}-{k[1]}")
def test_the_verb_refuses_it_and_validate_reports_it(key, tmp_path, monkeypatch, capsys):
    code, verb = key
    overrides, exit_code = cases(tmp_path)[key]
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(SECRET, raising=False)
    if code == "RESTARTS_UNAVAILABLE":
        monkeypatch.setattr(ftlaunch, "MODULE", "nvidia_resiliency_ext_absent_here")
    if code == "PACKAGE_MISSING" and importable("wandb"):
        pytest.skip("wandb is installed here")

    argv = [verb, *overrides, *(["--submit"] if (verb, code) == ("sbatch", "SECRET_NOT_SET") else [])]
    assert main(argv) == exit_code
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1].startswith(f"kilocard {verb}: error: "), err
    assert not list((tmp_path / "runs").glob("*")) if (tmp_path / "runs").is_dir() else True  # nothing written

    slurm = ["launcher=slurm"] if verb == "sbatch" else []
    main(["validate", *slurm, *overrides, "--format", "json"])
    found = {i["code"]: i["severity"] for i in json.loads(capsys.readouterr().out)["issues"]}
    check = next(c for c in refusals.CHECKS if c.code == code)
    assert found.get(code) == ("warning" if verb == "sbatch" and check.site else "error"), found


def test_a_refusal_of_where_the_run_goes_comes_first_and_alone(tmp_path, monkeypatch, capsys):
    """``run recipe=llama3_8b`` on a machine without its GPUs: the one line, no warning about the config first."""
    monkeypatch.chdir(tmp_path)
    assert main(["run", "recipe=llama3_8b", f"cluster.shared_fs={tmp_path}/runs", "trainer.train_iters=4"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("kilocard run: error: cluster=h100_dgx asks for 8 "), err
    assert not (tmp_path / "runs").exists()
