"""In-job restarts per megatron-core version (``ftlaunch.restart_support``): which NVRx each needs, and the
one line ``kilocard run`` gives where the installed versions cannot work.

The table is a pure function; the last test runs in both CI passes (marker ``mcore_range``): on
megatron-core 0.16.1 with NVRx 0.4.1 (the main pass) in-job restarts are allowed; on megatron-core 0.19.2
under Python 3.11 (the second pass) they are refused with the per-version line, nothing written.
"""

from __future__ import annotations

import sys
from importlib import metadata

import pytest

from kilocard.cli import main
from kilocard.launch.ftlaunch import restart_support

PY311, PY312 = (3, 11), (3, 12)


@pytest.mark.parametrize(
    ("mcore", "nvrx", "python", "words"),
    [
        ("0.16.1", "0.4.1", PY311, None),
        ("0.18.0", "0.4.1", PY312, None),
        ("0.19.2", "0.6.0", PY312, None),
        ("0.16.1", None, PY311, None),  # NVRx missing altogether: ftlaunch.available's own line
        ("0.19.2", "0.4.1", PY311, "need nvidia-resiliency-ext >= 0.6.0, which needs Python >= 3.12 (this is 3.11)"),
        ("0.19.2", None, PY311, "use megatron-core 0.16.1-0.18.x with pip install 'kilocard[resiliency]'"),
        ("0.19.2", "0.4.1", PY312, "nvidia-resiliency-ext 0.4.1 is installed, megatron-core 0.19.2 needs >= 0.6.0"),
        ("0.19.0rc1", "0.5.0", PY312, "pip install 'nvidia-resiliency-ext>=0.6.0'"),
    ],
)
def test_what_works_per_megatron_core_version(mcore, nvrx, python, words):
    why = restart_support(mcore, nvrx, python)
    if words is None:
        assert why is None
    else:
        assert why is not None and words in why and why.endswith("or set launcher.max_restarts=0"), why


@pytest.mark.mcore_range
def test_this_installation_allows_or_refuses_in_job_restarts_in_one_line(tmp_path, monkeypatch, capsys):
    from kilocard.config.compose import compose, to_run_config
    from kilocard.launch.local import unavailable

    mcore = metadata.version("megatron-core")
    why = unavailable(to_run_config(compose(["recipe=tiny_gpt", "launcher.max_restarts=1"])))
    if not (mcore.startswith("0.19") and sys.version_info < (3, 12)):
        assert why is None  # the main pass: megatron-core 0.16.1 with NVRx 0.4.1 restarts in-job
        return
    assert why is not None and f"in-job restarts on megatron-core {mcore} need nvidia-resiliency-ext >= 0.6.0" in why
    monkeypatch.chdir(tmp_path)
    assert main(["run", "recipe=tiny_gpt", "launcher.max_restarts=1", "cluster.shared_fs=runs"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == f"kilocard run: error: {why}"
    assert not (tmp_path / "runs").exists()
