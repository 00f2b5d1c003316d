"""``kilocard image``: a build context (Dockerfile, kilocard's wheel, the preflight) for ``packaging=image``."""

from __future__ import annotations

import argparse

from kilocard.commands import exits
from kilocard.commands.output import fail
from kilocard.launch.image import DEFAULT_BASE, ImageError, write_build_context

HELP = "write a Dockerfile (+ wheel) for a container image holding kilocard"
#: Shown under ``kilocard image --help`` (each parsed by tests/commands/test_cli_help.py).
EXAMPLES = ("kilocard image --output kilocard-image --tag kilocard:dev",)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """``--output``, ``--base``, ``--tag``."""
    p.add_argument("--output", default="kilocard-image", help="build-context directory to write")
    p.add_argument("--base", default=DEFAULT_BASE, help="base image with megatron-core and TE (default: NeMo)")
    p.add_argument("--tag", default=None, help="image tag (default: kilocard:<version>)")


def execute(args: argparse.Namespace) -> int:
    """Write the build context; print how to build, import and use the image."""
    try:
        out, version = write_build_context(args.output, base=args.base)
    except ImageError as e:
        return fail("image", str(e), exits.INVALID)
    tag = args.tag or f"kilocard:{version}"
    squash = f"{out}/{tag.replace(':', '-')}.sqsh"
    print(f"build context: {out}")
    print(f"build:  docker build -t {tag} {out}")
    print(f"import: enroot import -o {squash} dockerd://{tag}")
    print(f"then:   cluster.container_image={squash} launcher.packaging=image")
    return exits.OK
