"""Fixtures the e2e modules share (plain helpers are in the ``_*.py`` modules beside this one)."""

from __future__ import annotations

from pathlib import Path

import pytest

from _models import swap_models


@pytest.fixture(scope="module")
def models_dir(zoo: dict, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The swap models (``_models.swap_models``), written once per test module."""
    return swap_models(zoo, tmp_path_factory.mktemp("models"))
