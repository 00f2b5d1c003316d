"""Shared pytest fixtures."""

import pytest


@pytest.fixture(scope="session")
def all_recipes():
    """Every shipped recipe composed once, as ``{name: RunConfig}`` (Hydra composition is slow)."""
    from kilocard.config.compose import recipe_catalog
    from kilocard.recipes import compose_recipes

    names = list(recipe_catalog())
    return dict(zip(names, compose_recipes(names)))
