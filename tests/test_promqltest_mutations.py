"""Mutation sweep: for every eval of the conformance corpus that passes (stable float,
experimental and native-histogram alike, run as tests/test_promqltest.py runs them), a mutated
expectation must be reported as a failure by the runner.

Each passing eval gets one mutation, rotating through the kinds that apply to it: a changed
expected value (scalar, vector or range point), a dropped expected series, an extra expected
series, a changed expected error message/regex, a changed expected annotation message. One
unmutated pass and one mutated pass over all files (in-memory storage: this tests the runner),
with native-histogram evals run.
"""
from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from tests.helpers import SHARED

from promql.promqltest import FileRunner
from promql.promqltest_classify import EXP, NH, PLAIN
from promql.promqltest_script import EvalCmd, Hist

try:
    import promql.engine  # noqa: F401

    ENGINE = True
except Exception:  # noqa: BLE001
    ENGINE = False

FILES = sorted((SHARED / "promqltest").glob("*.test"))


def _bump(v: float) -> float:
    if math.isnan(v) or math.isinf(v):
        return 1.0
    return v * 2 if v != 0 else 1.0


def _kinds(cmd: EvalCmd) -> list[str]:
    kinds = []
    if cmd.is_fail:
        if cmd.expected_fail_message is not None or cmd.expected_fail_regexp is not None:
            kinds.append("fail_message")
        fails = cmd.expects.get("fail", [])
        if fails and (fails[0].message is not None or fails[0].regex is not None):
            kinds.append("fail_message")
        return kinds
    if cmd.expected_string is not None:
        return ["string"]
    if cmd.expect_scalar:
        return ["value"]
    if any(any(v is not None and not isinstance(v, Hist) for v in vals) for _, vals in cmd.expected.values()):
        kinds.append("value")
    if cmd.expected:
        kinds.append("drop_series")
    kinds.append("extra_series")
    for kind in ("warn", "info"):
        if any(e.message is not None for e in cmd.expects.get(kind, [])):
            kinds.append("annotation")
    return kinds


def _apply(cmd: EvalCmd, kind: str) -> str:
    if kind == "fail_message":
        if cmd.expected_fail_message is not None:
            cmd.expected_fail_message += " (mutated)"
        elif cmd.expected_fail_regexp is not None:
            cmd.expected_fail_regexp = re.compile(r"^mutated regex that matches nothing$")
        else:
            e = cmd.expects["fail"][0]
            if e.message is not None:
                e.message += " (mutated)"
            else:
                e.regex = re.compile(r"^mutated regex that matches nothing$")
        return kind
    if kind == "string":
        cmd.expected_string = (cmd.expected_string or "") + "-mutated"
        return kind
    if kind == "value":
        if cmd.expect_scalar:
            cmd.scalar = _bump(cmd.scalar)
            return kind
        for lbl in sorted(cmd.expected):
            pos, vals = cmd.expected[lbl]
            for i, v in enumerate(vals):
                if v is not None and not isinstance(v, Hist):
                    vals = list(vals)
                    vals[i] = _bump(v)
                    cmd.expected[lbl] = (pos, vals)
                    return kind
    if kind == "drop_series":
        del cmd.expected[sorted(cmd.expected)[0]]
        return kind
    if kind == "extra_series":
        n = max(1, len(next(iter(cmd.expected.values()))[1]) if cmd.expected else 1)
        cmd.expected[(("__mutant__", "1"),)] = (len(cmd.expected) + 1, [1.0] * n)
        return kind
    if kind == "annotation":
        for k in ("warn", "info"):
            for e in cmd.expects.get(k, []):
                if e.message is not None:
                    e.message += " (mutated)"
                    return kind
    raise AssertionError(kind)


@pytest.mark.timeout(900)
@pytest.mark.xfail(not ENGINE, strict=True, reason="needs promql.engine.Engine")
def test_every_mutated_expectation_is_caught():
    passing: dict[tuple[str, int], str] = {}
    for path in FILES:
        for o in FileRunner(storage="memory", run_native_histograms=True).run_file(path):
            if o.status == "pass":
                passing[(path.name, o.line)] = o.kind
    per_kind = {k: sum(1 for v in passing.values() if v == k) for k in (PLAIN, EXP, NH)}
    assert per_kind[PLAIN] > 700 and per_kind[EXP] > 200 and per_kind[NH] > 600, per_kind

    applied: dict[tuple[str, int], str] = {}
    counter = [0]

    def mutate_for(fname: str):
        def mutate(cmd: EvalCmd) -> str | None:
            if (fname, cmd.line) not in passing:
                return None
            kinds = _kinds(cmd)
            if not kinds:
                return None
            kind = kinds[counter[0] % len(kinds)]
            counter[0] += 1
            applied[(fname, cmd.line)] = _apply(cmd, kind)
            return applied[(fname, cmd.line)]
        return mutate

    missed = []
    for path in FILES:
        runner = FileRunner(storage="memory", run_native_histograms=True, mutate=mutate_for(path.name))
        for o in runner.run_file(path):
            key = (path.name, o.line)
            if key in applied and o.status != "fail":
                missed.append(f"{path.name}:{o.line} [{applied[key]}] {o.expr}")
    kinds_used = sorted(set(applied.values()))
    mutated_kinds = {k: sum(1 for key in applied if passing[key] == k) for k in (PLAIN, EXP, NH)}
    assert mutated_kinds[PLAIN] > 700 and mutated_kinds[EXP] > 200 and mutated_kinds[NH] > 600, mutated_kinds
    assert {"value", "drop_series", "extra_series", "fail_message"} <= set(kinds_used), kinds_used
    assert not missed, missed[:20]
