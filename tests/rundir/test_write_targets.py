"""Where kilocard may write (``kilocard.rundir.targets``): every writer asks the one authority first.

Each input here was accepted once: a run, a dataset, a plot or a site file written inside another run's
committed step; a plot written under another name than the one given, into ``/dev``, or an internal
error; a mount list pyxis splits wrongly; a build context written into a full directory.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from kilocard.commands import main
from kilocard.config.compose import compose
from kilocard.rundir import targets
from kilocard.rundir.freeze import write_frozen


def committed_run(root: Path, name: str = "base1", step: int = 8) -> Path:
    """A run directory whose ``checkpoints/`` holds committed step ``step`` (manifest, tracker, owner)."""
    run = root / name
    run.mkdir(parents=True)
    write_frozen(compose(["recipe=tiny_gpt"]), run)
    ck = run / "checkpoints"
    sdir = ck / f"step_{step:07d}"
    sdir.mkdir(parents=True)
    data = b"{}"
    (sdir / "trainer_state.json").write_bytes(data)
    files = {"trainer_state.json": {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}}
    (sdir / "manifest.json").write_text(json.dumps({"step": step, "files": files, "run": str(run.resolve())}))
    (ck / "latest_committed.txt").write_text(f"{step}\n")
    (ck / "owner.json").write_text(json.dumps({"run": str(run.resolve())}))
    return run


def snapshot(root: Path) -> dict[str, int]:
    """Every path under ``root`` with its size (directories 0): what a refused command must not change."""
    return {str(p.relative_to(root)): (p.stat().st_size if p.is_file() else 0) for p in root.rglob("*")}


def one_line_usage(capsys, verb: str) -> str:
    err = capsys.readouterr().err
    assert err.startswith(f"kilocard {verb}: error: ") and len(err.strip().splitlines()) == 1, err
    assert "internal error" not in err and "Traceback" not in err, err
    return err


# --- a new run's checkpoint.save and run directory -----------------------------------------------------


@pytest.mark.parametrize("where", ["step_0000008", "step_0000008/deeper", "new", ""])
def test_a_new_run_never_saves_inside_another_runs_checkpoints(where, tmp_path, capsys, monkeypatch):
    """``checkpoint.save=runs/base1/checkpoints/step_0000008`` used to pass: owner.json, a tracker and step 2
    were written inside step 8, and base1's resume then failed BAD_CKPT."""
    monkeypatch.chdir(tmp_path)
    base = committed_run(tmp_path / "runs")
    before = snapshot(base)
    save = f"runs/base1/checkpoints/{where}".rstrip("/")
    assert main(["validate", "recipe=tiny_gpt", f"checkpoint.save={save}"]) == 1
    out = capsys.readouterr().out
    assert "checkpoint.save" in out and ("WRITE_TARGET" in out or "CHECKPOINT_SAVE_OWNED" in out), out
    assert main(["run", "recipe=tiny_gpt", f"checkpoint.save={save}", "cluster.shared_fs=runs"]) == 1
    assert snapshot(base) == before and sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["base1"]


def test_a_save_directory_of_its_own_is_accepted(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    committed_run(tmp_path / "runs")
    assert main(["validate", "recipe=tiny_gpt", "checkpoint.save=mine/ck"]) == 0
    assert targets.save_issues(str(tmp_path / "shared")) == []


@pytest.mark.parametrize("field", ["data.path_to_cache", "checkpoint.non_persistent_local_ckpt_dir"])
def test_the_jobs_other_folders_are_never_inside_a_checkpoint_tree(field, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    committed_run(tmp_path / "runs")
    assert main(["validate", "recipe=tiny_gpt", f"{field}=runs/base1/checkpoints/cache"]) == 1
    assert f"WRITE_TARGET: {field}" in capsys.readouterr().out


def test_run_directories_are_never_made_inside_a_checkpoint_tree(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    committed_run(tmp_path / "runs")
    rc = main(["sbatch", "recipe=tiny_gpt", "cluster.shared_fs=runs/base1/checkpoints/step_0000008/runs"])
    assert rc == 1 and "WRITE_TARGET: cluster.shared_fs" in capsys.readouterr().err
    assert not (tmp_path / "runs/base1/checkpoints/step_0000008/runs").exists()


# --- mount paths ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "override, field",
    [
        ("checkpoint.save='/tmp/a,/etc:/etc'", "checkpoint.save"),
        ("checkpoint.save=/", "checkpoint.save"),
        ("checkpoint.load=/data/x:y", "checkpoint.load"),
        ("cluster.shared_fs=/", "cluster.shared_fs"),
        ("data.path_to_cache='/c,d'", "data.path_to_cache"),
        ("cluster.container_mounts=['/a:/a,/etc:/etc']", "cluster.container_mounts[0]"),
    ],
)
def test_a_path_a_mount_list_cannot_carry_is_refused_at_validate(override, field, tmp_path, capsys, monkeypatch):
    """pyxis splits ``--container-mounts`` on ``,`` and ``:``: ``/tmp/a,/etc:/etc`` mounted the host's /etc, and
    ``checkpoint.save=/`` mounted ``/:/``."""
    monkeypatch.chdir(tmp_path)
    argv = ["recipe=tiny_gpt", "cluster.container_image=/img/k.sqsh", "--skip-path-checks", override]
    assert main(["validate", *argv]) == 1
    out = capsys.readouterr().out
    assert f"MOUNT_PATH: {field}" in out, out
    assert main(["sbatch", *argv, "--dry-run"]) == 1
    assert "--container-mounts" not in capsys.readouterr().out


def test_mount_paths_matter_only_with_a_container(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert targets.mount_problem("/lustre/runs") is None and targets.mount_problem("/") is not None
    assert main(["validate", "recipe=tiny_gpt", "checkpoint.save='/tmp/a,b'", "--skip-path-checks"]) == 0


# --- preprocess, image, convert ------------------------------------------------------------------------


@pytest.mark.parametrize("prefix", ["", "out/", "runs/trk/checkpoints/step_0000008/x"])
def test_preprocess_writes_only_a_prefix_that_names_a_file_outside_checkpoints(prefix, tmp_path, capsys, monkeypatch):
    """``--output-prefix ''`` wrote ``_text_document.bin``; a prefix inside a committed step wrote a dataset
    there."""
    monkeypatch.chdir(tmp_path)
    committed_run(tmp_path / "runs", "trk")
    (tmp_path / "in.jsonl").write_text('{"text": "hello"}\n')
    before = snapshot(tmp_path)
    assert main(["preprocess", "--input", "in.jsonl", "--output-prefix", prefix]) == 2
    err = one_line_usage(capsys, "preprocess")
    assert "--output-prefix" in err
    assert snapshot(tmp_path) == before


def test_image_output_is_a_new_or_empty_directory(tmp_path, capsys):
    """A non-empty directory was written into; an existing Dockerfile was exit 1; a file was a raw errno."""
    full = tmp_path / "full"
    full.mkdir()
    (full / "notes.txt").write_text("mine\n")
    (tmp_path / "ctx").mkdir()
    (tmp_path / "ctx" / "Dockerfile").write_text("FROM x\n")
    (tmp_path / "afile").write_text("x")
    for out, what in (
        (full, "not empty"),
        (tmp_path / "ctx", "not empty"),
        (tmp_path / "afile", "already exists as a file"),
    ):
        before = snapshot(tmp_path)
        assert main(["image", "--output", str(out)]) == 2
        assert what in one_line_usage(capsys, "image")
        assert snapshot(tmp_path) == before
    assert main(["image", "--output", str(tmp_path / "afile" / "sub")]) == 2
    assert "is not a directory" in one_line_usage(capsys, "image")


@pytest.mark.integration  # the convert verb imports torch
def test_convert_output_inside_a_committed_step_is_refused(tmp_path, capsys):
    base = committed_run(tmp_path / "runs")
    before = snapshot(base)
    out = base / "checkpoints" / "step_0000008" / "hf"
    assert main(["convert", "mcore-to-hf", str(base / "checkpoints"), str(out)]) == 2
    assert "lies inside the checkpoint directory" in one_line_usage(capsys, "convert")
    assert snapshot(base) == before


# --- plots and site files: used as given or refused ----------------------------------------------------


def bad_plot_paths(tmp: Path) -> list[tuple[str, str]]:
    """``(path, what the error says)``: every one of them used to write elsewhere or fail inside."""
    (tmp / "pd").mkdir(exist_ok=True)
    (tmp / "pd.png").mkdir(exist_ok=True)
    base = tmp / "runs" / "base1"
    if not base.exists():
        committed_run(tmp / "runs")
    return [
        (str(tmp / "noext"), "does not end in"),  # matplotlib wrote noext.png
        (str(tmp / "pd"), "does not end in"),  # a directory: "wrote pd", but pd.png was written
        (str(tmp / "pd.png"), "is a directory"),
        (str(tmp / "out.txt"), "does not end in"),  # an internal ValueError
        ("/dev/full.png", "lies in /dev"),
        (str(tmp / "missing" / "p.png"), "is not a directory"),
        (str(base / "checkpoints" / "step_0000008" / "p.png"), "inside the checkpoint directory"),
        ("", "is empty"),
    ]


@pytest.mark.parametrize("verb", ["report", "budget", "plan"])
def test_a_plot_path_is_used_as_given_or_refused_in_one_line(verb, tmp_path, capsys):
    """``report RUN --plot /tmp`` wrote ``/tmp.png``; ``--plot /dev/full.png`` wrote into /dev; ``budget --plot
    pd`` said "wrote pd" and wrote pd.png; ``--plot out.txt`` was an internal ValueError."""
    argv = {
        "report": ["report", str(tmp_path / "runs" / "base1")],
        "budget": ["budget", "recipe=tiny_gpt", "gpus=8", "days=10"],
        "plan": ["plan", "recipe=tiny_gpt", "--top", "1"],
    }[verb]
    for path, what in bad_plot_paths(tmp_path):
        before = snapshot(tmp_path)
        assert main([*argv, "--plot", path]) == 2, path
        assert what in one_line_usage(capsys, verb), path
        assert snapshot(tmp_path) == before, path
    assert not Path("/dev/full.png").exists()


def test_a_plot_is_written_exactly_where_named(tmp_path, capsys):
    out = tmp_path / "frontier.svg"
    assert main(["budget", "recipe=tiny_gpt", "gpus=8", "days=10", "--plot", str(out)]) in (0, 1)
    assert out.read_bytes().lstrip().startswith(b"<?xml") and sorted(p.name for p in tmp_path.iterdir()) == [
        "frontier.svg"
    ]
    assert f"wrote {out}" in capsys.readouterr().err


@pytest.mark.parametrize("name, what", [("site.txt", "does not end in"), ("noext", "does not end in")])
def test_a_site_file_is_a_yaml_file_named_as_given(name, what, tmp_path, capsys):
    run = committed_run(tmp_path / "runs")
    assert main(["baselines", "--site", str(tmp_path / name), "--add", str(run)]) == 2
    assert what in one_line_usage(capsys, "baselines")
    assert not list(tmp_path.glob(f"{name}*"))


def test_a_site_file_inside_a_checkpoint_tree_is_refused(tmp_path, capsys):
    run = committed_run(tmp_path / "runs")
    before = snapshot(run)
    site = run / "checkpoints" / "site.yaml"
    assert main(["baselines", "--site", str(site), "--add", str(run)]) == 2
    assert "inside the checkpoint directory" in one_line_usage(capsys, "baselines")
    assert snapshot(run) == before


def test_write_file_renames_into_place_or_leaves_nothing(tmp_path):
    out = targets.output_file("--plot", str(tmp_path / "a.png"))
    with targets.write_file(out, "--plot") as tmp:
        tmp.write_bytes(b"png")
    assert out.read_bytes() == b"png" and [p.name for p in tmp_path.iterdir()] == ["a.png"]
    with pytest.raises(RuntimeError), targets.write_file(out, "--plot") as tmp:
        tmp.write_bytes(b"half")
        raise RuntimeError("drawing failed")
    assert out.read_bytes() == b"png" and [p.name for p in tmp_path.iterdir()] == ["a.png"]
