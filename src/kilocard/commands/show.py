"""``kilocard show``: print the composed config (Hydra's ``--cfg``, ``--package``, ``--resolve``)."""

from __future__ import annotations

import argparse

from omegaconf import DictConfig, OmegaConf

from kilocard.commands import exits
from kilocard.commands.common import add_config_args
from kilocard.config.compose import ComposeError, compose, expand_sweeps

HELP = "print the composed config"
#: Shown under ``kilocard show --help`` (each parsed by tests/commands/test_cli_help.py).
EXAMPLES = (
    "kilocard show recipe=llama3_8b",
    "kilocard show recipe=tiny_gpt --package model",
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Overrides, ``-m``, ``--cfg``, ``--resolve``, ``-p``."""
    add_config_args(p)
    p.add_argument("-c", "--cfg", choices=("job", "hydra", "all"), default="job", help="Hydra's --cfg")
    p.add_argument("--resolve", action="store_true", help="resolve interpolations (Hydra's --resolve)")
    p.add_argument("-p", "--package", default=None, help="print only this node (Hydra's --package)")


def job_text(cfg: DictConfig, package: str | None, resolve: bool) -> str:
    """The job config (or one node/field of it) as YAML; the ``hydra`` node is popped off ``cfg``."""
    OmegaConf.set_struct(cfg, False)
    cfg.pop("hydra", None)
    absent = object()
    node = cfg if package is None else OmegaConf.select(cfg, package, default=absent)
    if node is absent:
        raise ComposeError(
            f"{package}: no such node for --package (expected a group or field path, e.g. model or model.hidden_size)",
            field=package,
        )
    if OmegaConf.is_config(node):
        return OmegaConf.to_yaml(node, resolve=resolve)
    return OmegaConf.to_yaml({"v": node}).split(": ", 1)[1]  # a single field: its value as YAML writes it


def execute(args: argparse.Namespace) -> int:
    """Compose each sweep point and print it."""
    for combo in expand_sweeps(args.overrides, args.multirun):
        cfg = compose(combo, return_hydra_config=args.cfg in ("hydra", "all"))
        if args.multirun:
            print(f"# overrides: {' '.join(combo)}")
        hydra_node = cfg.get("hydra") if args.cfg != "job" else None
        if args.cfg in ("job", "all"):
            print(job_text(cfg, args.package, args.resolve), end="")
        if hydra_node is not None:
            print(OmegaConf.to_yaml({"hydra": hydra_node}, resolve=args.resolve), end="")
    return exits.OK
