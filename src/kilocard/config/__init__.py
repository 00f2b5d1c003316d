"""Configuration: schema, Hydra composition, freezing to a run directory."""

from kilocard.config.compose import ComposeError, compose, compose_many, load_run_config
from kilocard.config.schema import RunConfig

__all__ = ["ComposeError", "RunConfig", "compose", "compose_many", "load_run_config"]
