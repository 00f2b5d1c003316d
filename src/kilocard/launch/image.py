"""``kilocard image``: a container image that holds kilocard (``launcher.packaging=image``).

``dockerfile()`` returns the Dockerfile text: FROM a base that ships Megatron-Core and Transformer
Engine (the NeMo framework container by default), kilocard's wheel installed without dependencies
(torch, megatron-core and TE stay the image's own builds), and the in-job preflight run once at build
time so an image whose megatron-core is outside kilocard's range, or that lacks a module kilocard
imports, fails to build instead of failing every job. ``kilocard.commands.image`` writes the build context
(Dockerfile, wheel, preflight.py) and prints the docker build and enroot import lines; the cluster
profile then names the resulting image (``cluster.container_image``).
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from kilocard.base.shell import ShellValueError, image_reference
from kilocard.launch.package import PREFLIGHT, mcore_range, pack_checkout, repack_installed
from kilocard.launch.rundir import RunDirError
from kilocard.paths import checkout_root, data_dir
from kilocard.rundir.targets import output_dir

DEFAULT_BASE = "nvcr.io/nvidia/nemo:26.04"
#: Where the wheel and preflight go inside the image.
IMAGE_DIR = "/opt/kilocard"


def dockerfile(base: str, wheel_name: str, version: str, mcore: tuple[str, str]) -> str:
    """The Dockerfile text: ``base`` + kilocard ``version`` from ``wheel_name``, checked at build time.

    The build-time preflight sees no GPU (and no driver, so it does not ask for Transformer Engine);
    the in-job preflight checks GPUs and, for FP8/FP4 configs, TE on every node.
    """
    return "\n".join(
        [
            f"# kilocard {version} on {base} (written by `kilocard image`).",
            "# The base provides torch, megatron-core and Transformer Engine; kilocard adds no dependency.",
            f"FROM {base}",
            f"COPY {wheel_name} {PREFLIGHT} {IMAGE_DIR}/",
            f"RUN python -m pip install --no-cache-dir --no-deps {IMAGE_DIR}/{wheel_name}",
            "# Build-time preflight: kilocard, torch and megatron-core import, megatron-core in range.",
            f"RUN python {IMAGE_DIR}/{PREFLIGHT} /tmp/kilocard-preflight --gpus-per-node 0 "
            f"--mcore-min {mcore[0]} --mcore-below {mcore[1]} && rm -rf /tmp/kilocard-preflight",
            f"RUN python -c \"from importlib.metadata import version; assert version('kilocard') == '{version}'\"",
            f"ENV KILOCARD_VERSION={version} PYTHONUNBUFFERED=1",
            f"LABEL org.opencontainers.image.title=kilocard org.opencontainers.image.version={version}",
            "",
        ]
    )


class ImageError(Exception):
    """The build context cannot be written (the message names the cause)."""


def write_build_context(output: str, base: str = DEFAULT_BASE) -> tuple[Path, str]:
    """Write the wheel, ``preflight.py`` and the ``Dockerfile`` into ``output``; return it and the version."""
    try:
        image_reference("--base", base)  # a newline here would add a RUN line to the Dockerfile
    except ShellValueError as e:
        raise ImageError(str(e)) from None
    out = output_dir("--output", output).resolve()  # a new or empty directory, outside every checkpoint tree
    made = not out.exists()
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="kilocard-image-") as tmp:
            root = checkout_root()
            built = pack_checkout(root, Path(tmp)) if root is not None else repack_installed(Path(tmp))
            wheel = Path(shutil.copy2(built, out / built.name))
    except (RunDirError, OSError) as e:
        _clear(out, made)
        raise ImageError(
            f"--output: {out}: cannot write the build context ({getattr(e, 'strerror', None) or e})"
        ) from None
    version = wheel.name.split("-")[1]
    try:
        shutil.copy2(data_dir("slurm") / PREFLIGHT, out / PREFLIGHT)
        (out / "Dockerfile").write_text(dockerfile(base, wheel.name, version, mcore_range()))
    except OSError as e:
        _clear(out, made)
        raise ImageError(f"--output: {out}: cannot write the build context ({e.strerror})") from None
    return out, version


def _clear(out: Path, made: bool) -> None:
    """Leave ``out`` as it was: removed when this call made it, emptied when it was an empty directory."""
    if made:
        shutil.rmtree(out, ignore_errors=True)
        return
    for p in out.iterdir():
        shutil.rmtree(p, ignore_errors=True) if p.is_dir() and not p.is_symlink() else p.unlink(missing_ok=True)
