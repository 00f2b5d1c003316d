"""``kilocard run`` knows where it is, and a run root is a real directory of this site (issue 25, part 3).

The machine check is a pure function of the profile and the CUDA devices' names, so the GPU cases are
proven here with device names as ``torch.cuda.get_device_name`` gives them (no GPU on this machine); the
CLI cases drive the real verbs on this CPU machine. The shipped profiles' ``shared_fs`` (``/lustre/...``)
does not exist here, which is exactly the case a new user meets.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from kilocard.cli import main
from kilocard.config.compose import compose, to_run_config
from kilocard.launch.local import machine_mismatch
from kilocard.launch.rundir import shared_fs_problem

H100 = "NVIDIA H100 80GB HBM3"


@pytest.fixture(scope="module")
def h100_cfg():
    return to_run_config(compose(["recipe=llama3_8b", "cluster=h100_dgx"]))


def test_a_gpu_profile_on_a_machine_without_gpus_names_both_fixes(h100_cfg):
    why = machine_mismatch(h100_cfg, [])
    assert why == (
        "cluster=h100_dgx asks for 8 h100-sxm5-80gb GPU(s); this machine has no GPU: use cluster=local_cpu to "
        "train on CPU ranks here, or kilocard sbatch to run on that cluster"
    )


def test_a_gpu_profile_fits_a_machine_with_those_gpus(h100_cfg):
    assert machine_mismatch(h100_cfg, [H100] * 8) is None
    few = dataclasses.replace(h100_cfg, cluster=dataclasses.replace(h100_cfg.cluster, gpus_per_node=2))
    assert machine_mismatch(few, [H100] * 8) is None  # --nproc 2 on a DGX


@pytest.mark.parametrize(
    ("gpus", "words"),
    [
        ([H100] * 4, "this machine has 4 of that model (4 GPU(s): NVIDIA H100 80GB HBM3)"),
        (["NVIDIA A100-SXM4-80GB"] * 8, "this machine has 0 of that model (8 GPU(s): NVIDIA A100-SXM4-80GB)"),
    ],
)
def test_too_few_or_other_gpus_are_refused(h100_cfg, gpus, words):
    why = machine_mismatch(h100_cfg, gpus)
    assert why is not None and words in why and why.endswith("or kilocard sbatch to run on that cluster")


def test_more_than_one_node_is_a_clusters_job(h100_cfg):
    two = dataclasses.replace(h100_cfg, cluster=dataclasses.replace(h100_cfg.cluster, nodes=2))
    why = machine_mismatch(two, [H100] * 8)
    assert why is not None and why.startswith("cluster.nodes=2: kilocard run trains on this machine only")


def test_cpu_ranks_fit_any_machine():
    assert machine_mismatch(to_run_config(compose(["recipe=tiny_gpt"])), []) is None


@pytest.mark.integration  # kilocard run imports the training stack before refusing
def test_run_of_a_gpu_recipe_here_refuses_before_writing(tmp_path, monkeypatch, capsys):
    """The ~50 s of eight CPU ranks ending FAULT 76 is now one line, exit 2, nothing written."""
    monkeypatch.chdir(tmp_path)
    assert main(["run", "recipe=llama3_8b"]) == 2
    err = capsys.readouterr().err
    assert "kilocard run: error: cluster=h100_dgx asks for 8 h100-sxm5-80gb GPU(s)" in err
    assert "cluster=local_cpu" in err and "Traceback" not in err
    assert list(tmp_path.iterdir()) == [] and not Path("/lustre").exists()


@pytest.mark.parametrize("verb", ["sbatch", "run"])
def test_the_shipped_placeholder_shared_fs_is_refused_not_created(tmp_path, monkeypatch, capsys, verb):
    monkeypatch.chdir(tmp_path)
    # run: a CPU machine's profile with the placeholder a DGX profile ships (the machine check passes)
    extra = ["cluster.name=h100_dgx", "cluster.shared_fs=/lustre/fsw/kilocard/runs"] if verb == "run" else []
    assert main([verb, "recipe=tiny_gpt" if verb == "run" else "recipe=llama3_8b", *extra]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith(
        f"kilocard {verb}: error: cluster.shared_fs: /lustre/fsw/kilocard/runs is the h100_dgx profile's "
        "placeholder, not a directory here; give your site's value (a site profile, or cluster.shared_fs="
    ), err
    assert not Path("/lustre").exists() and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("verb", ["sbatch", "run"])
def test_a_missing_parent_is_never_created(tmp_path, capsys, verb):
    root = tmp_path / "typo" / "runs"
    assert main([verb, "recipe=tiny_gpt", f"cluster.shared_fs={root}"]) == 2
    err = capsys.readouterr().err
    assert f"cluster.shared_fs: {root}: {root.parent} does not exist" in err and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []


def test_the_last_directory_is_made_and_an_existing_placeholder_path_is_a_path(tmp_path):
    assert shared_fs_problem(to_run_config(compose(["recipe=tiny_gpt", f"cluster.shared_fs={tmp_path}/runs"]))) is None
    assert main(["sbatch", "recipe=tiny_gpt", f"cluster.shared_fs={tmp_path}/runs", "launcher.packaging=none"]) == 0
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert run_dir.name.startswith("tiny_gpt-")  # <recipe>-<timestamp>, not kilocard-...


def test_dry_run_output_is_a_script_sbatch_takes(tmp_path, monkeypatch, capsys):
    """`sbatch --dry-run > job.sh`: the first line is the #! line; a placeholder root is said in a comment."""
    monkeypatch.chdir(tmp_path)
    assert main(["sbatch", "recipe=llama3_8b", "--dry-run"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "#!/bin/bash" and lines[1].startswith("# run dir: /lustre/fsw/kilocard/runs/llama3_8b-")
    assert lines[2].startswith("# kilocard sbatch (without --dry-run) refuses this run root: cluster.shared_fs:")
    assert "#SBATCH --job-name=llama3_8b" in lines


def test_a_relative_shipped_root_under_an_existing_directory_is_made(tmp_path, monkeypatch):
    """local_cpu's own `shared_fs: runs` is a real default (under the cwd), not a placeholder."""
    monkeypatch.chdir(tmp_path)
    assert shared_fs_problem(to_run_config(compose(["recipe=tiny_gpt"]))) is None
