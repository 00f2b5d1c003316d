"""One error boundary for every verb, and the safe reader under the config verbs (real composition).

Every file kilocard reads for a config (a recipe given by path, the files of a site directory) comes
through ``kilocard.base.safe_read``; every error reaches the user as one line with a documented exit
code; an unexpected error is one line naming it a bug (``KILOCARD_DEBUG=1`` shows the traceback).
"""

from __future__ import annotations

import time

import pytest

from bad_files import SECRET, SECRET_FILES, finishes, make
from kilocard.commands import COMMANDS, DEBUG_ENV, exits, main


def run_main(argv, capsys, seconds: float = 60.0):
    out = finishes(lambda: main(argv), seconds)
    if "error" in out:
        raise out["error"]
    o, e = capsys.readouterr()
    return out["value"], o, e


@pytest.mark.parametrize(
    ("kind", "why"),
    [
        ("fifo", "is a FIFO (named pipe), not a regular file"),  # hung `kilocard validate/show` forever
        ("dir", "is a directory, not a regular file"),  # IsADirectoryError traceback
        ("broken", "is a broken symlink"),  # FileNotFoundError traceback
        ("latin1", "is not UTF-8 text (bad byte at offset 9); save it as UTF-8"),
    ],
)
@pytest.mark.parametrize("verb", ["validate", "show"])
def test_a_recipe_path_that_is_not_a_regular_utf8_file_is_one_line(verb, kind, why, tmp_path, capsys):
    path = make(kind, tmp_path / "x.yaml")
    rc, out, err = run_main([verb, f"recipe={path}"], capsys)
    assert rc == exits.USAGE
    assert err.strip() == f"kilocard {verb}: error: {path}: {why}"


@pytest.mark.parametrize("name", sorted(SECRET_FILES))
def test_a_secret_file_given_as_recipe_is_never_echoed(name, tmp_path, capsys):
    """``kilocard validate recipe=~/.netrc`` printed the password line as an "unknown field"."""
    path = make(name, tmp_path / name)
    rc, out, err = run_main(["validate", f"recipe={path}"], capsys)
    assert rc == exits.USAGE and SECRET not in out + err
    assert err.strip() == (
        f"kilocard validate: error: {path}: holds a single value, not a mapping of fields (is it a config "
        "file?); a config file maps field names to values (model: ..., trainer: ...)"
    )


def test_a_fifo_in_a_site_directory_is_one_line(tmp_path, monkeypatch, capsys):
    fifo = make("fifo", tmp_path / "site" / "model" / "x.yaml")
    monkeypatch.setenv("KILOCARD_CONFIG_PATH", str(tmp_path / "site"))
    rc, out, err = run_main(["show", "recipe=tiny_gpt"], capsys)
    assert (
        rc == exits.USAGE and err.strip() == f"kilocard show: error: {fifo}: is a FIFO (named pipe), not a regular file"
    )


def test_the_root_as_site_directory_is_not_walked(monkeypatch, capsys):
    """``KILOCARD_CONFIG_PATH=/`` walked the whole tree into /proc (a traceback on a vanished pid):
    only the config groups' folders of a site directory are searched."""
    monkeypatch.setenv("KILOCARD_CONFIG_PATH", "/")
    start = time.monotonic()
    rc, out, err = run_main(["show", "recipe=tiny_gpt"], capsys)
    assert rc == exits.OK, err
    assert time.monotonic() - start < 30 and "num_layers" in out


def test_an_unexpected_error_is_one_line_naming_a_bug(monkeypatch, capsys):
    """A bug (here made by replacing a verb's body: no input is known to reach one, which is the point)
    is one line with its type and place, exit 1; ``KILOCARD_DEBUG=1`` lets the traceback through."""

    def broken(args):
        return {}[SECRET]

    monkeypatch.setattr(COMMANDS["recipes"], "execute", broken)
    rc, out, err = run_main(["recipes"], capsys)
    assert rc == exits.INVALID and SECRET not in err
    assert len(err.strip().splitlines()) == 1
    assert err.startswith("kilocard recipes: error: internal error (KeyError at test_error_boundary.py:")
    assert f"this is a bug in kilocard: please report it with the command line, and rerun with {DEBUG_ENV}=1" in err
    monkeypatch.setenv(DEBUG_ENV, "1")
    with pytest.raises(KeyError):
        main(["recipes"])


@pytest.mark.integration  # starts the console script in a process
@pytest.mark.parametrize("after_s", [0.3, 0.6, 1.0])
@pytest.mark.parametrize("verb", [["validate", "recipe=tiny_gpt"], ["recipes"], ["show", "recipe=tiny_gpt"]])
def test_ctrl_c_while_a_verb_starts_is_one_line_and_130(verb, after_s, tmp_path):
    """SIGINT in the first second of a verb (while Hydra and the verbs are imported) printed a KeyboardInterrupt
    traceback and died by the signal: it is one line and exit 130, as once the verb runs."""
    import signal
    import subprocess
    import sys
    from pathlib import Path

    script = Path(sys.executable).parent / "kilocard"
    proc = subprocess.Popen([str(script), *verb], cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    time.sleep(after_s)
    proc.send_signal(signal.SIGINT)
    err = proc.communicate(timeout=120)[1].decode()
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    if proc.returncode != exits.OK:  # a verb that had already finished on a fast machine exits 0
        assert proc.returncode == exits.INTERRUPTED and len(err.strip().splitlines()) == 1, (proc.returncode, err)
