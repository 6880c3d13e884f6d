from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

# pytest-xdist workers (``make test`` runs two) pick ports for their servers and peers from disjoint
# ranges below the kernel's ephemeral ports (scheduler_metrics/loopback_ports.py): from the kernel, one
# worker's etcd was handed a port another worker's process had just taken.
_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
if _WORKER.startswith("gw") and _WORKER[2:].isdigit():
    _lo = 20000 + 3000 * (int(_WORKER[2:]) % 4)
    os.environ.setdefault("TURBOPROM_PORT_RANGE", f"{_lo}-{_lo + 3000}")

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
