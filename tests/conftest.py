from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.helpers import ServerProcess  # noqa: E402


@pytest.fixture
def server(tmp_path: Path):
    """A real TurboProm server on a free loopback port with a fresh data dir."""
    with ServerProcess(tmp_path / "data") as s:
        yield s
