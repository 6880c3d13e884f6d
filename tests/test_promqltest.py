"""Every eval of every Prometheus conformance file in ../shared/promqltest is its own test case
(ids like ``functions.test:123``), run through ``promql.promqltest`` against our storage and engine.

* Stable float evals (``plain``, 785 of them) must pass, except those listed in
  tests/promqltest_known_failures.txt, which are xfail(strict=True): a listed case that starts
  passing fails the suite until it is removed from the list
  (``python -m promql.promqltest --write-known-failures``).
* Experimental evals are reported (xfail, non-strict: XPASS counts the ones that pass) and never
  fail the suite. Native-histogram evals and experimental syntax the parser rejects are skipped
  with their reason.

Each file is executed once (the first of its cases runs it; the others read the cached outcome),
so the whole corpus costs one pass of the runner. Storage: the real TSDB when ``storage.tsdb``
imports, else the in-memory source (override with PROMQLTEST_STORAGE=memory|tsdb).
"""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import SHARED

from promql.promqltest import FileRunner, Outcome, default_storage
from promql.promqltest_classify import EXP, NH, PLAIN, LoadedState, classify
from promql.promqltest_script import ClearCmd, EvalCmd, LoadCmd, parse_script

PROMQLTEST_DIR = SHARED / "promqltest"
KNOWN_FAILURES = Path(__file__).resolve().parent / "promqltest_known_failures.txt"


def _known_failures() -> set[str]:
    if not KNOWN_FAILURES.exists():
        return set()
    return {l.strip() for l in KNOWN_FAILURES.read_text().splitlines() if l.strip() and not l.startswith("#")}


def _collect() -> list:
    """(file, line, kind, reason) of every eval, classified without running anything."""
    known = _known_failures()
    params = []
    for path in sorted(PROMQLTEST_DIR.glob("*.test")):
        state = LoadedState()
        for cmd in parse_script(path.read_text()):
            if isinstance(cmd, ClearCmd):
                state.clear()
            elif isinstance(cmd, LoadCmd):
                state.add_load(cmd)
            elif isinstance(cmd, EvalCmd):
                cl = classify(cmd, state)
                cid = f"{path.name}:{cmd.line}"
                marks = []
                if cl.kind == PLAIN and cid in known:
                    marks.append(pytest.mark.xfail(strict=True, reason="listed in tests/promqltest_known_failures.txt"))
                elif cl.kind == EXP and cl.parse_error is None:
                    marks.append(pytest.mark.xfail(strict=False, reason=f"experimental ({cl.reason}); reported, never fails the suite"))
                params.append(pytest.param(path.name, cmd.line, cl.kind, id=cid, marks=marks))
    return params


_CACHE: dict[str, dict[int, Outcome]] = {}


def _outcomes(file: str) -> dict[int, Outcome]:
    if file not in _CACHE:
        runner = FileRunner(storage=default_storage())
        _CACHE[file] = {o.line: o for o in runner.run_file(PROMQLTEST_DIR / file)}
    return _CACHE[file]


_PARAMS = _collect()


def test_corpus_counts_match_inventory():
    """The plain/exp/nh classification reproduces ../shared/promqltest/INVENTORY.md."""
    counts = {PLAIN: 0, EXP: 0, NH: 0}
    for p in _PARAMS:
        counts[p.values[2]] += 1
    assert counts == {PLAIN: 785, EXP: 401, NH: 899}


@pytest.mark.timeout(600)
@pytest.mark.parametrize("file,line,kind", _PARAMS)
def test_promqltest_eval(file: str, line: int, kind: str):
    out = _outcomes(file).get(line)
    assert out is not None, f"{file}:{line} produced no outcome"
    if out.status == "skip":
        pytest.skip(out.message)
    assert out.status == "pass", f"{file}:{line}: {out.expr}: {out.message}"
