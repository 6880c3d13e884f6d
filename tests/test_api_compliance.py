"""Side-by-side PromQL compliance vs Prometheus 2.42 (bench/compliance.py) as a slow test:
every expanded query must match, except those documented in docs/compatibility.md
("Compliance vs Prometheus 2.42")."""
from __future__ import annotations

import re

import pytest

from tests.helpers import REPO, load_bench, require_binary


def _load():
    return load_bench("compliance")


def _documented_queries() -> set[str]:
    text = (REPO / "docs" / "compatibility.md").read_text()
    section = text.split("## Compliance vs Prometheus 2.42", 1)[1].split("\n## ", 1)[0]
    return {m.group(1) for m in re.finditer(r"^\| `(.+?)` \|", section, re.M)}


def test_expansion_matches_the_tester():
    cases = _load().expand_cases()
    assert len(cases) == 539
    assert sum(c.should_fail for c in cases) == 5


@pytest.mark.slow
@pytest.mark.peer
def test_compliance_vs_prometheus():
    require_binary("prometheus")
    require_binary("promtool")
    report = _load().run(parallel=4)
    assert report["cases"] == 539
    failing = {o["query"]: f"[{o['status']}] {o['detail']}" for o in report["outcomes"] if o["status"] != "passed"}
    # default settings (no exact, no approx): summaries may answer, and only exact ones do, so every
    # answer must equal Prometheus's but for the documented differences
    undocumented = {q: d for q, d in failing.items() if q not in _documented_queries()}
    assert not undocumented, undocumented


@pytest.mark.slow
@pytest.mark.peer
def test_compliance_live_remote_write_vs_prometheus():
    """Exporters scraped by a real Prometheus that remote-writes to TurboProm (staleness markers
    included); exact=true so that no summary answers; only documented differences remain."""
    require_binary("prometheus")
    mod = _load()
    mod.TARGET_EXTRA["exact"] = "true"
    try:
        report = mod.run_live(120, parallel=4)
    finally:
        mod.TARGET_EXTRA.clear()
    failing = {o["query"]: f"[{o['status']}] {o['detail']}" for o in report["outcomes"] if o["status"] != "passed"}
    undocumented = {q: d for q, d in failing.items() if q not in _documented_queries()}
    assert not undocumented, undocumented
