"""Code delivery (``launcher.packaging``): the snapshot a job runs, its provenance, previews, bad values.

Real snapshots (this checkout's files packed as a wheel, no build backend), a real pip install of one,
and real interpreters importing the unpacked snapshot from outside the repository; no cluster (the Slurm runs are in
tests/launch/test_slurm_snapshot.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kilocard.cli import main
from kilocard.launch.package import stage_code

TINY = ["recipe=tiny_gpt", "launcher.signal_lead_s=60"]


def python_in(site: Path, code: str, cwd: Path) -> subprocess.CompletedProcess:
    """A fresh interpreter whose only kilocard is the one under ``site``."""
    env = {**os.environ, "PYTHONPATH": str(site), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.integration  # builds the wheel / runs a fresh interpreter
def test_snapshot_is_the_checkouts_wheel_unpacked_with_pinned_dependencies(tmp_path):
    """code/ holds the wheel, site/ imports on its own (conf included), requirements pin this host's versions."""
    from importlib import metadata

    stage_code(tmp_path, "snapshot")
    code = tmp_path / "code"
    (wheel,) = code.glob("kilocard-*-py3-none-any.whl")
    assert (tmp_path / "preflight.py").read_text() == (Path(__file__).parents[2] / "slurm/preflight.py").read_text()
    pins = (code / "requirements.txt").read_text().splitlines()
    assert (
        f"megatron-core=={metadata.version('megatron-core')}" in pins and f"torch=={metadata.version('torch')}" in pins
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    proc = python_in(code / "site", "import kilocard; from kilocard.paths import data_dir; "
                     "print(kilocard.__file__, data_dir('conf'))", elsewhere)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    pkg, conf = proc.stdout.split()
    assert pkg == str(code / "site" / "kilocard" / "__init__.py") and Path(conf, "cluster", "h100_dgx.yaml").exists()
    assert wheel.stat().st_size > 10_000


@pytest.mark.integration  # builds the wheel / runs a fresh interpreter
def test_installed_kilocard_without_checkout_is_repacked(tmp_path):
    """kilocard installed from a wheel (no pyproject above it): its files are re-packed into a wheel."""
    (tmp_path / "first").mkdir()
    stage_code(tmp_path / "first", "snapshot")
    site = tmp_path / "first" / "code" / "site"
    probe = (
        "from pathlib import Path; import zipfile; from kilocard.launch.package import write_snapshot; "
        "from kilocard.paths import checkout_root; "
        f"assert checkout_root() is None; w = write_snapshot(Path({str(tmp_path / 'again')!r})); "
        "print(w); print('\\n'.join(zipfile.ZipFile(w).namelist()))"
    )
    proc = python_in(site, probe, tmp_path)
    assert proc.returncode == 0, proc.stderr
    wheel, *names = proc.stdout.split()
    assert Path(wheel).name == "kilocard-0.1.0-py3-none-any.whl"
    for name in ("kilocard/__init__.py", "kilocard/conf/config.yaml", "kilocard/slurm/preflight.py"):
        assert name in names, name
    assert "kilocard-0.1.0.dist-info/METADATA" in names and not any("__pycache__" in n for n in names)
    assert (tmp_path / "again" / "site" / "kilocard" / "launch" / "package.py").exists()


@pytest.mark.integration  # builds the code snapshot's wheel
def test_sbatch_writes_the_snapshot_and_says_provenance_is_the_submit_hosts(tmp_path, capsys):
    """The run dir has code/ and preflight.py; provenance.json is labelled as the submit host's view."""
    assert main(["sbatch", *TINY, f"cluster.shared_fs={tmp_path}"]) == 0
    run_dir = Path(dict(line.split(": ", 1) for line in capsys.readouterr().out.splitlines())["run dir"])
    assert (run_dir / "code" / "site" / "kilocard" / "__init__.py").exists() and (run_dir / "preflight.py").exists()
    prov = json.loads((run_dir / "provenance.json").read_text())
    assert prov["submit_host"]["libraries"]["megatron-core"] and "host" not in prov and "libraries" not in prov
    assert prov["what_ran"].startswith("provenance/job-")


def test_packaging_none_writes_no_code(tmp_path, capsys):
    assert main(["sbatch", *TINY, f"cluster.shared_fs={tmp_path}", "launcher.packaging=none"]) == 0
    (run_dir,) = tmp_path.iterdir()
    assert (run_dir / "preflight.py").exists() and not (run_dir / "code").exists()


def test_bad_packaging_is_one_line_and_writes_nothing(tmp_path, capsys):
    """An unknown mode, and image mode without an image: exit 1, the field named, no run directory."""
    for value, words in (("wheel", "expected one of snapshot, image, none"), ("image", "cluster.container_image")):
        rc = main(["sbatch", *TINY, f"cluster.shared_fs={tmp_path}", f"launcher.packaging={value}"])
        err = capsys.readouterr().err
        assert rc == 1 and "PACKAGING: launcher.packaging = " in err and words in err, err
        assert "Traceback" not in err
    assert list(tmp_path.iterdir()) == []


def test_dry_run_prints_the_script_and_writes_nothing(tmp_path, capsys):
    root = tmp_path / "runs"
    assert main(["sbatch", *TINY, f"cluster.shared_fs={root}", "launcher.run_name=r1", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"#!/bin/bash\n# run dir: {root}/r1 (dry run: nothing written)\n# kilocard batch script")
    assert f"RUN_DIR={root}/r1" in out and '"$RUN_DIR/preflight.py"' in out
    assert not root.exists()


@pytest.mark.integration  # runs a fresh interpreter / git / pip
def test_snapshot_needs_no_build_backend_and_pip_installs_it(tmp_path):
    """The snapshot is packed from the checkout's files: no hatchling, no pip at submit time (an install
    without the test extra, `pip install -e .`, used to fail with "No module named 'hatchling'").
    The packed wheel is a real one: pip installs it (no dependencies) with its metadata and console script."""
    probe = (
        "import sys; sys.modules['hatchling'] = None; sys.modules['pip'] = None\n"
        "import subprocess; subprocess.run = subprocess.Popen = None  # nothing may be run\n"
        "from pathlib import Path; from kilocard.launch.package import write_snapshot\n"
        f"print(write_snapshot(Path({str(tmp_path / 'code')!r})))"
    )
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    wheel = Path(proc.stdout.strip())
    assert (tmp_path / "code" / "site" / "kilocard" / "conf" / "config.yaml").is_file()
    target = tmp_path / "installed"
    pip = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target", str(target), str(wheel)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert pip.returncode == 0, pip.stderr
    meta = "from importlib.metadata import version, entry_points; print(version('kilocard'), "
    meta += "[e.value for e in entry_points(group='console_scripts') if e.name == 'kilocard'])"
    got = python_in(target, meta, tmp_path)
    assert got.returncode == 0, got.stderr
    assert got.stdout.split(None, 1) == ["0.1.0", "['kilocard.cli:_entry']\n"]
    assert (target / "bin" / "kilocard").is_file()


def test_an_unusable_checkout_is_one_line_and_leaves_no_run_directory(tmp_path):
    """A checkout whose pyproject names no wheel packages: PackageError naming it and the fix; nothing left."""
    from kilocard.config.compose import compose
    from kilocard.launch.package import PackageError, pack_checkout
    from kilocard.launch.rundir import create_run_dir

    bad = tmp_path / "checkout"
    bad.mkdir()
    (bad / "pyproject.toml").write_text('[project]\nname = "kilocard"\nversion = "0.0.1"\n')
    with pytest.raises(PackageError, match=r"names no project, version or wheel packages; fix the checkout"):
        pack_checkout(bad, tmp_path)
    root = tmp_path / "runs"
    with pytest.raises(PackageError):
        create_run_dir(compose(["recipe=tiny_gpt"]), [], root=root, stage=lambda d: pack_checkout(bad, d))
    assert list(root.iterdir()) == []


@pytest.mark.integration  # runs a fresh interpreter / git / pip
def test_untracked_source_files_make_the_provenance_dirty(tmp_path):
    """``launcher.packaging=snapshot`` ships an untracked module of the checkout, so provenance.json may
    not say ``dirty: false`` for it (it did: untracked files were not looked at); an untracked file the
    wheel does not ship (notes, run directories) leaves the tree clean."""
    from kilocard.launch.rundir import code_version

    def git(*args):
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True)

    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "kilocard"\n[tool.hatch.build.targets.wheel]\npackages = ["src/kilocard"]\n'
    )
    (tmp_path / "src" / "kilocard").mkdir(parents=True)
    (tmp_path / "src" / "kilocard" / "__init__.py").write_text("")
    git("init", "-q")
    git("add", "-A")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "init")
    (tmp_path / "notes.txt").write_text("not shipped")
    clean = code_version(tmp_path)
    assert clean["dirty"] is False and clean["untracked"] == []
    (tmp_path / "src" / "kilocard" / "extra.py").write_text("X = 1\n")
    dirty = code_version(tmp_path)
    assert dirty["dirty"] is True and dirty["untracked"] == ["src/kilocard/extra.py"]
