"""Every eval of every Prometheus conformance file in ../shared/promqltest is its own test case
(ids like ``functions.test:123``), run through ``promql.promqltest`` against our storage and engine.

Every eval must pass, stable float (``plain``), experimental (``exp``) and native-histogram
(``nh``) alike, unless it is listed with a reason in the known-failure list of its kind:

* ``tests/promqltest_known_failures.txt``: stable float evals
* ``tests/promqltest_known_failures_experimental.txt``: experimental evals
* ``tests/promqltest_known_failures_native_histograms.txt``: native-histogram evals

Strict both ways: an unlisted eval that fails (or is not run, e.g. because the parser rejects
it) fails the suite, and so does a listed eval that passes (remove it from its list). A listed
eval that still fails is reported as xfail with its reason. ``test_known_failure_lists`` checks
the lists themselves: each entry names an eval of the corpus, of the list's kind, once, with a
reason.

Each file is executed once (the first of its cases runs it; the others read the cached outcome):
a default pass for the stable and experimental evals and, when the file has native-histogram
evals, a second pass over just those with ``run_native_histograms`` (what
``python -m promql.promqltest --native-histograms`` does). Storage: the real TSDB when
``storage.tsdb`` imports, else the in-memory source (override with
PROMQLTEST_STORAGE=memory|tsdb).

Regenerate the lists after a change (keeps the reasons of entries that still fail, proposes one
for new entries; review the diff):

    .venv/bin/python -m tests.test_promqltest --write-lists
"""
from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.helpers import SHARED

from promql.promqltest import FileRunner, Outcome, default_storage
from promql.promqltest_classify import EXP, NH, PLAIN, LoadedState, classify
from promql.promqltest_script import ClearCmd, EvalCmd, LoadCmd, parse_script

PROMQLTEST_DIR = SHARED / "promqltest"
TESTS = Path(__file__).resolve().parent
KNOWN_FAILURES = TESTS / "promqltest_known_failures.txt"
LISTS = {
    PLAIN: KNOWN_FAILURES,
    EXP: TESTS / "promqltest_known_failures_experimental.txt",
    NH: TESTS / "promqltest_known_failures_native_histograms.txt",
}
KIND_NAMES = {PLAIN: "stable float", EXP: "experimental", NH: "native-histogram"}
_ENTRY = re.compile(r"^(?P<id>[^\s:]+\.test:\d+)(?:\s+(?P<reason>\S.*))?$")


# ---------------------------------------------------------------------------------------------
# the lists


@dataclass(frozen=True)
class Entry:
    case_id: str
    reason: str
    list_name: str
    lineno: int


def read_list(path: Path) -> tuple[list[Entry], list[str]]:
    """Entries of one list (``<file>:<line>  <reason>`` a line; ``#`` comments, blank lines) and
    the format problems found (an entry without a reason, an unreadable line)."""
    entries: list[Entry] = []
    problems: list[str] = []
    if not path.exists():
        return entries, problems
    for n, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        m = _ENTRY.match(line)
        if m is None:
            problems.append(f"{path.name}:{n}: not '<file>.test:<line>  <reason>': {line!r}")
            continue
        if not m.group("reason"):
            problems.append(f"{path.name}:{n}: {m.group('id')} has no reason")
        entries.append(Entry(m.group("id"), m.group("reason") or "", path.name, n))
    return entries, problems


def _known() -> dict[str, Entry]:
    """case id -> its entry, over all lists (the consistency test reports duplicates)."""
    known: dict[str, Entry] = {}
    for path in LISTS.values():
        for e in read_list(path)[0]:
            known.setdefault(e.case_id, e)
    return known


# ---------------------------------------------------------------------------------------------
# the corpus


@dataclass(frozen=True)
class Case:
    file: str
    line: int
    kind: str
    expr: str
    parse_error: str | None

    @property
    def case_id(self) -> str:
        return f"{self.file}:{self.line}"


def _corpus() -> list[Case]:
    """Every eval, classified without running anything."""
    cases = []
    for path in sorted(PROMQLTEST_DIR.glob("*.test")):
        state = LoadedState()
        for cmd in parse_script(path.read_text()):
            if isinstance(cmd, ClearCmd):
                state.clear()
            elif isinstance(cmd, LoadCmd):
                state.add_load(cmd)
            elif isinstance(cmd, EvalCmd):
                cl = classify(cmd, state)
                cases.append(Case(path.name, cmd.line, cl.kind, cmd.expr, cl.parse_error))
    return cases


CASES = _corpus()
_PARAMS = [pytest.param(c.file, c.line, c.kind, id=c.case_id) for c in CASES]
_CACHE: dict[str, dict[int, Outcome]] = {}


def _outcomes(file: str) -> dict[int, Outcome]:
    if file not in _CACHE:
        path = PROMQLTEST_DIR / file
        storage = default_storage()
        outs = {o.line: o for o in FileRunner(storage=storage).run_file(path) if o.kind != NH}
        nh_lines = {c.line for c in CASES if c.file == file and c.kind == NH}
        if nh_lines:
            runner = FileRunner(storage=storage, run_native_histograms=True, only_lines=nh_lines)
            outs.update({o.line: o for o in runner.run_file(path) if o.kind == NH})
        _CACHE[file] = outs
    return _CACHE[file]


# ---------------------------------------------------------------------------------------------
# tests


def test_corpus_counts_match_inventory():
    """The plain/exp/nh classification reproduces ../shared/promqltest/INVENTORY.md."""
    counts = {PLAIN: 0, EXP: 0, NH: 0}
    for c in CASES:
        counts[c.kind] += 1
    assert counts == {PLAIN: 785, EXP: 401, NH: 899}


def test_known_failure_lists():
    """Each entry names an eval of the corpus, in the list of its kind, once, with a reason."""
    kinds = {c.case_id: c.kind for c in CASES}
    problems: list[str] = []
    seen: dict[str, str] = {}
    for kind, path in LISTS.items():
        assert path.exists(), f"{path} is missing (an empty list is a file with comments only)"
        entries, fmt = read_list(path)
        problems += fmt
        for e in entries:
            where = f"{e.list_name}:{e.lineno}: {e.case_id}"
            if e.case_id in seen:
                problems.append(f"{where}: listed twice (also in {seen[e.case_id]})")
            seen[e.case_id] = e.list_name
            if e.case_id not in kinds:
                problems.append(f"{where}: no such eval in ../shared/promqltest")
            elif kinds[e.case_id] != kind:
                problems.append(f"{where}: a {KIND_NAMES[kinds[e.case_id]]} eval, listed as {KIND_NAMES[kind]}"
                                f" (belongs in {LISTS[kinds[e.case_id]].name})")
    assert not problems, "\n".join(problems)


_KNOWN = _known()


@pytest.mark.timeout(600)
@pytest.mark.parametrize("file,line,kind", _PARAMS)
def test_promqltest_eval(file: str, line: int, kind: str):
    cid = f"{file}:{line}"
    out = _outcomes(file).get(line)
    assert out is not None, f"{cid} produced no outcome"
    entry = _KNOWN.get(cid)
    if entry is not None:
        if out.status == "pass":
            pytest.fail(f"{cid} passes but is listed in tests/{entry.list_name} ({entry.reason}): "
                        "remove it from the list")
        pytest.xfail(f"{entry.list_name}: {entry.reason}")
    if out.status == "skip":
        pytest.fail(f"{cid}: {out.expr}: not run ({out.message}); make it run, or list it in "
                    f"tests/{LISTS[kind].name} with a reason")
    assert out.status == "pass", f"{cid}: {out.expr}: {out.message}"


# ---------------------------------------------------------------------------------------------
# regenerating the lists

_HEADERS = {
    PLAIN: "Stable float promqltest evals",
    EXP: "Experimental promqltest evals (experimental functions, aggregators, syntax, data)",
    NH: "Native-histogram promqltest evals",
}


def _proposed_reason(case: Case, out: Outcome) -> str:
    """A first reason for a new entry, from what the failure looks like (edit it if it says too little)."""
    expr, msg = case.expr, out.message
    if out.status == "skip" and case.parse_error is not None:
        return f"not run: the parser rejects it ({case.parse_error[:80]})"
    if case.file == "start_timestamps.test":
        if "overlaps with previous sample" in _expected_text(case):
            return "expects the start-time overlap warning: start timestamps (@st) are not stored"
        fn = re.search(r"\b(start_timestamp|irate|rate|increase|resets)\(", expr)
        return f"start timestamps (@st) are not stored, so {fn.group(1) if fn else 'the query'}() cannot use them"
    if "custom-bucket" in msg or "custom bucket" in msg:
        what = "combining" if "combining" in msg else ("counter-reset detection across" if "counter-reset" in msg
                                                       else "rate/irate/idelta over")
        return f"{what} custom-bucket histograms with different bounds is refused (bounds not reconciled)"
    if "conflicting counter resets" in _expected_text(case):
        return "expects the conflicting-counter-reset warning of Prometheus's HistogramStatsIterator (not modelled)"
    return f"{out.status}: {msg[:120]}"


def _expected_text(case: Case) -> str:
    lines = (PROMQLTEST_DIR / case.file).read_text().splitlines()
    body = []
    for ln in lines[case.line:]:
        if not ln.strip() or ln.lstrip().startswith(("eval", "load", "clear")):
            break
        body.append(ln)
    return "\n".join(body)


def write_lists() -> dict[str, int]:
    known = _known()
    by_kind: dict[str, list[str]] = {PLAIN: [], EXP: [], NH: []}
    for c in CASES:
        out = _outcomes(c.file).get(c.line)
        if out is None or out.status == "pass":
            continue
        entry = known.get(c.case_id)
        stale = entry is not None and "rejects" in entry.reason and c.parse_error is None  # parses now
        reason = entry.reason if entry is not None and entry.reason and not stale else _proposed_reason(c, out)
        by_kind[c.kind].append(f"{c.case_id}  {reason}")
    for kind, path in LISTS.items():
        head = (f"# {_HEADERS[kind]} that fail or are not run: one a line, '<file>:<line>  <reason>'.\n"
                "# Read by tests/test_promqltest.py, strict both ways: an unlisted failing eval fails the\n"
                "# suite, and so does a listed eval that passes (remove it from this list).\n"
                "# Regenerate (keeps the reasons here): .venv/bin/python -m tests.test_promqltest --write-lists\n")
        path.write_text(head + "".join(line + "\n" for line in by_kind[kind]))
    return {k: len(v) for k, v in by_kind.items()}


if __name__ == "__main__":
    if sys.argv[1:] != ["--write-lists"]:
        sys.exit("usage: python -m tests.test_promqltest --write-lists")
    for kind, n in write_lists().items():
        print(f"{LISTS[kind].name}: {n} entries ({KIND_NAMES[kind]})")
