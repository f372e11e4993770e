"""Fixtures of the daemon tests: anyio's pytest plugin on asyncio (the tests that run the service
in their own event loop), and ``root``, a test's folder with ``models/`` to stage inputs in."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def root(tmp_path: Path) -> Path:
    (tmp_path / "models").mkdir()
    return tmp_path
