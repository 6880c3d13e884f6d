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


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Refuse a collection where two items share a node id: pytest-xdist (``make test`` runs two
    workers) runs one item per node id, so the others would silently not run (schemathesis'
    ``schema.parametrize()`` over several operations does this)."""
    counts: dict[str, int] = {}
    for item in items:
        counts[item.nodeid] = counts.get(item.nodeid, 0) + 1
    dup = sorted(n for n, c in counts.items() if c > 1)
    if dup:
        raise pytest.UsageError(f"{len(dup)} node ids are shared by several tests (give each its own name): {dup[:5]}")
