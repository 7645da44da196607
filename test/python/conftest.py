"""Shared fixtures: torch models imported once per session, a private cache dir for imports."""

from __future__ import annotations

import os
import tempfile

import pytest

os.environ.setdefault("COLLAGE_CACHE_DIR", os.path.join(tempfile.gettempdir(), "collage-test-cache"))


@pytest.fixture(scope="session")
def torch():
    return pytest.importorskip("torch")
