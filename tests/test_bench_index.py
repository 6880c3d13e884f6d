"""bench/README.md lists every benchmark script, and only scripts that exist (so the index and the
directory cannot drift apart)."""
from __future__ import annotations

import re
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "bench"


def test_every_bench_script_is_listed_once() -> None:
    listed = re.findall(r"^\| `([a-z0-9_]+\.py)` \|", (BENCH / "README.md").read_text(), flags=re.M)
    present = sorted(p.name for p in BENCH.glob("*.py") if p.name != "__init__.py")
    assert sorted(listed) == present
    assert len(listed) == len(set(listed))
