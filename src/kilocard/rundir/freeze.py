"""Freeze a composed config: resolved YAML plus its sha256, the one record of what a run is.

Every rank loads the frozen file and checks the hash before it trains, so what ran is exactly
what was validated (``kilocard.rundir.freeze.load_verified``).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from kilocard.base.digest import sha256_file
from kilocard.config.compose import ComposeError, load_run_config
from kilocard.config.schema import RunConfig

CONFIG_FILE = "config.yaml"
HASH_FILE = "config.sha256"


class FrozenConfigError(Exception):
    """The frozen config of a run directory is missing, altered or unreadable."""


def frozen_yaml(cfg: DictConfig) -> tuple[str, str]:
    """Resolved YAML of ``cfg`` (without the ``hydra`` node) and the sha256 of its bytes."""
    container = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(container, dict)
    container.pop("hydra", None)
    text = OmegaConf.to_yaml(OmegaConf.create(container))
    return text, hashlib.sha256(text.encode()).hexdigest()


def write_frozen(cfg: DictConfig, run_dir: Path) -> str:
    """Write ``config.yaml`` and ``config.sha256`` into ``run_dir``; return the hash."""
    text, digest = frozen_yaml(cfg)
    (run_dir / CONFIG_FILE).write_text(text)
    (run_dir / HASH_FILE).write_text(f"{digest}  {CONFIG_FILE}\n")
    return digest


def load_verified(run_dir: Path) -> tuple[RunConfig, str]:
    """Load the run's config after checking its sha256; raise ``FrozenConfigError`` naming the file."""
    cfg_path, hash_path = run_dir / CONFIG_FILE, run_dir / HASH_FILE
    for p in (cfg_path, hash_path):
        if not p.is_file():
            raise FrozenConfigError(f"{p}: missing; is {run_dir} a kilocard run directory?")
    expected = hash_path.read_text().split()[0]
    actual = sha256_file(cfg_path)
    if actual != expected:
        raise FrozenConfigError(
            f"{cfg_path}: sha256 {actual[:12]}... does not match {HASH_FILE} ({expected[:12]}...); "
            f"the frozen config was edited after validation; create a new run instead"
        )
    try:
        return load_run_config(cfg_path), actual
    except ComposeError as e:
        raise FrozenConfigError(f"{cfg_path}: {e}") from None
