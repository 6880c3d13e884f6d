"""Tests of the promqltest runner itself: script parsing, comparison rules (FORMAT.md 4.1-4.3),
classification, the in-memory source, and end-to-end mutation checks (a changed value, a dropped
or extra series, a wrong order, a wrong error message must each be reported as a failure)."""
from __future__ import annotations

import math

import numpy as np
import pytest

from promql.memory_source import MemorySource
from promql.promqltest import FileRunner, at_modifier_cases
from promql.promqltest_classify import EXP, NH, PLAIN, LoadedState, classify
from promql.promqltest_compare import Actual, Series, almost_equal, check_annotations, check_expected_failure, compare
from promql.promqltest_script import ClearCmd, EvalCmd, Hist, LoadCmd, ScriptError, expand_values, parse_duration, parse_script, parse_series_desc
from storage.batch import SampleBatch
from storage.matchers import Matcher
from storage.stale import STALE_NAN, is_stale, is_stale_value

try:
    import promql.engine  # noqa: F401

    ENGINE = True
except Exception:  # noqa: BLE001
    ENGINE = False

needs_engine = pytest.mark.xfail(not ENGINE, strict=True, reason="needs promql.engine.Engine")


# ---------------------------------------------------------------------------------------------
# script parsing


def test_expand_values_grammar():
    v = expand_values("5 2+3x2 _ stale {{schema:1 sum:3 count:22 buckets:[5 10 7]}}")
    assert v[:4] == [5.0, 2.0, 5.0, 8.0]
    assert v[4] is None
    assert is_stale_value(v[5])
    assert isinstance(v[6], Hist) and len(v) == 7
    assert expand_values("1+1x4 9+1x4") == [1, 2, 3, 4, 5, 9, 10, 11, 12, 13]
    assert expand_values("_x3 1") == [None, None, None, 1.0]  # _xN is N positions
    assert expand_values("7x2") == [7.0, 7.0, 7.0]  # vxN is N+1 positions
    assert expand_values("10-2x2") == [10.0, 8.0, 6.0]
    assert expand_values("-1-1x2") == [-1.0, -2.0, -3.0]
    assert expand_values("1e3 0x1f")[0] == 1000.0
    inf_nan = expand_values("+Inf -Inf NaN")
    assert inf_nan[0] == math.inf and inf_nan[1] == -math.inf and math.isnan(inf_nan[2])
    assert len(expand_values("{{schema:0 sum:1 count:1}}x2")) == 3
    assert len(expand_values("{{schema:0 sum:1}}+{{schema:0 sum:1}}x3")) == 4


def test_series_desc_and_durations():
    lbl, rest = parse_series_desc('http_requests{job="api", path="/a\\"b\\n"}  1 2')
    assert lbl == (("__name__", "http_requests"), ("job", "api"), ("path", '/a"b\n'))
    assert rest == "1 2"
    assert parse_series_desc('{__name__="x", a="b"} 3')[0] == (("__name__", "x"), ("a", "b"))
    assert parse_series_desc("{} 3")[0] == ()
    assert parse_series_desc('{"my.metric", "a.b"="c"} 1')[0] == (("__name__", "my.metric"), ("a.b", "c"))
    assert parse_duration("1h30m") == 5_400_000 and parse_duration("0") == 0 and parse_duration("5m1ms") == 300_001
    with pytest.raises(ValueError):
        parse_series_desc('x{a=~"b"} 1')


def test_parse_script_commands():
    cmds = parse_script(
        """
# comment
load 5m
    a{x="1"} 0+10x2
    a{x="1"} 1 2

load_with_nhcb 1m
    h_bucket{le="+Inf"} 1

eval instant at 10m a
    expect warn msg: PromQL warning: boom (1:1)
    expect no_info
    a{x="1"} 2

eval range from 0 to 10m step 5m a * 2
    {x="1"} 2 4 _

eval instant at 1m 1 + 1
    2

eval instant at 1m foo[1m]
    expect range vector from 0 to 1m step 30s
    foo 1 2 3

eval instant at 0 "x"
    expect string "x"

eval_fail instant at 0m foo
    expected_fail_message some error

eval instant at 0 sort(a)
    expect ordered
    expect fail regex: bad.*thing

clear
"""
    )
    kinds = [type(c).__name__ for c in cmds]
    assert kinds == ["LoadCmd", "LoadCmd", "EvalCmd", "EvalCmd", "EvalCmd", "EvalCmd", "EvalCmd", "EvalCmd", "EvalCmd", "ClearCmd"]
    load = cmds[0]
    assert load.interval_ms == 300_000 and list(load.series.values()) == [[1.0, 2.0]]  # last definition wins
    assert cmds[1].with_nhcb
    ev = cmds[2]
    assert not ev.is_range and ev.eval_ms == 600_000 and ev.expects["warn"][0].message == "PromQL warning: boom (1:1)"
    assert ev.expected[(("__name__", "a"), ("x", "1"))] == (1, [2.0])
    rg = cmds[3]
    assert rg.is_range and (rg.start_ms, rg.end_ms, rg.step_ms) == (0, 600_000, 300_000)
    assert rg.expected[(("x", "1"),)][1] == [2.0, 4.0, None]
    assert cmds[4].expect_scalar and cmds[4].scalar == 2.0
    rv = cmds[5]
    assert rv.expect_range_vector and rv.exclude_from_range_query and rv.step_ms == 30_000 and rv.eval_ms == 60_000
    assert cmds[6].expected_string == "x"
    assert cmds[7].is_fail and cmds[7].expected_fail_message == "some error"
    assert cmds[8].is_ordered and cmds[8].is_fail and cmds[8].expects["fail"][0].regex is not None


def test_parse_script_errors():
    with pytest.raises(ScriptError):
        parse_script("bogus command")
    with pytest.raises(ScriptError):
        parse_script("eval instant at 0 a\n    a 1 2\n")  # several values for an instant eval
    with pytest.raises(ScriptError):
        parse_script("eval instant at 0 a\n    expect info\n    expect no_info\n")


# ---------------------------------------------------------------------------------------------
# comparison rules


def _cmd(text: str) -> EvalCmd:
    cmds = [c for c in parse_script(text) if isinstance(c, EvalCmd)]
    return cmds[0]


A = (("__name__", "a"), ("x", "1"))
B = (("__name__", "a"), ("x", "2"))


def test_almost_equal_rules():
    assert almost_equal(1.0, 1.0 + 1e-9)
    assert not almost_equal(1.0, 1.00001)
    assert almost_equal(math.nan, math.nan)
    assert not almost_equal(STALE_NAN, math.nan) and almost_equal(STALE_NAN, STALE_NAN)
    assert not almost_equal(0.0, 1e-300)  # zero: effectively exact
    assert almost_equal(math.inf, math.inf) and not almost_equal(math.inf, -math.inf)


def test_vector_mutations_are_caught():
    cmd = _cmd('eval instant at 0 a\n    a{x="1"} 1\n    a{x="2"} 2\n')
    good = Actual("vector", vector=[(A, 1.0), (B, 2.0)])
    assert compare(cmd, good) is None
    assert "expected 1 for" in compare(cmd, Actual("vector", vector=[(A, 1.5), (B, 2.0)]))
    assert "not found" in compare(cmd, Actual("vector", vector=[(A, 1.0)]))
    extra = (("__name__", "a"), ("x", "3"))
    assert "unexpected metric" in compare(cmd, Actual("vector", vector=[(A, 1.0), (B, 2.0), (extra, 3.0)]))
    assert "expected vector or matrix" in compare(cmd, Actual("scalar", scalar=1.0))
    # a result without __name__ does not match an expectation with it
    assert compare(cmd, Actual("vector", vector=[((("x", "1"),), 1.0), (B, 2.0)])) is not None


def test_ordered_and_matrix_rules():
    cmd = _cmd('eval instant at 0 sort(a)\n    expect ordered\n    a{x="1"} 1\n    a{x="2"} 2\n')
    assert compare(cmd, Actual("vector", vector=[(A, 1.0), (B, 2.0)])) is None
    assert "at position" in compare(cmd, Actual("vector", vector=[(B, 2.0), (A, 1.0)]))
    unordered = _cmd('eval instant at 0 a\n    a{x="1"} 1\n    a{x="2"} 2\n')
    assert compare(unordered, Actual("vector", vector=[(B, 2.0), (A, 1.0)])) is None
    rng = _cmd('eval range from 0 to 2m step 1m a\n    a{x="1"} 1 _ 3\n    a{x="2"} 2x2\n')
    s1 = Series(A, np.array([0, 120_000]), np.array([1.0, 3.0]))
    s2 = Series(B, np.array([0, 60_000, 120_000]), np.array([2.0, 2.0, 2.0]))
    assert compare(rng, Actual("matrix", matrix=[s1, s2])) is None
    assert "sorted" in compare(rng, Actual("matrix", matrix=[s2, s1]))
    s1_bad_ts = Series(A, np.array([0, 60_000]), np.array([1.0, 3.0]))
    assert "timestamp" in compare(rng, Actual("matrix", matrix=[s1_bad_ts, s2]))
    s1_extra_point = Series(A, np.array([0, 60_000, 120_000]), np.array([1.0, 2.0, 3.0]))
    assert "float points" in compare(rng, Actual("matrix", matrix=[s1_extra_point, s2]))
    assert "ordered" in compare(cmd, Actual("matrix", matrix=[s1, s2]))


def test_annotation_and_failure_rules():
    cmd = _cmd("eval instant at 0 a\n    expect warn msg: PromQL warning: w1 (1:1)\n    expect no_info\n")
    assert check_annotations(cmd, "a", ["PromQL warning: w1 (1:1)"], []) is None
    assert check_annotations(cmd, "a", [], []) is not None
    assert check_annotations(cmd, "a", ["PromQL warning: w1 (1:1)", "PromQL warning: other (1:1)"], []) is not None
    assert check_annotations(cmd, "a", ["PromQL warning: w1 (1:1)"], ["PromQL info: i (1:1)"]) is not None
    lax = _cmd("eval instant at 0 a\n")
    assert check_annotations(lax, "a", ["anything"], ["whatever"]) is None  # unchecked without expect lines
    rx = _cmd("eval instant at 0 a\n    expect info regex: PromQL info: .* \\([0-9]+:[0-9]+\\)\n")
    assert check_annotations(rx, "a", [], ["PromQL info: abc (3:7)"]) is None
    fail = _cmd("eval instant at 0 a\n    expect fail msg: vector cannot contain metrics with the same labelset\n")
    assert check_expected_failure(fail, "vector cannot contain metrics with the same labelset") is None
    assert check_expected_failure(fail, "vector cannot contain metrics with the same label set") is not None
    legacy = _cmd("eval_fail instant at 0 a\n    expected_fail_regexp many-to-many.*\n")
    assert check_expected_failure(legacy, "found duplicate series; many-to-many matching not allowed") is None


# ---------------------------------------------------------------------------------------------
# classification and the @ re-run


def test_classification_rules():
    state = LoadedState()
    load = parse_script('load 1m\n    hist {{schema:0 sum:1 count:1}}\n    f 1\n')[0]
    assert isinstance(load, LoadCmd)
    state.add_load(load)
    assert classify(_cmd("eval instant at 0 f + 1\n"), state).kind == PLAIN
    assert classify(_cmd("eval instant at 0 hist\n"), state).kind == NH
    assert classify(_cmd("eval instant at 0 limitk(1, f)\n"), state).kind == EXP
    dur = classify(_cmd("eval instant at 0 f[1m+1s]\n"), state)
    assert dur.kind == EXP and dur.parse_error is None and "duration expression" in dur.reason
    assert classify(_cmd("eval instant at 0 rate(f[1m] anchored)\n"), state).kind == EXP
    broken = classify(_cmd("eval instant at 0 sum(f\n"), state)
    assert broken.kind == EXP and broken.parse_error == "1:6: parse error: unclosed left parenthesis"
    assert classify(_cmd("eval instant at 0 predict_linear(f[5m], 1h)\n"), state).kind == EXP
    assert classify(_cmd("eval instant at 0 mad_over_time(f[5m])\n"), state).kind == EXP


def test_at_modifier_rerun_cases():
    from promql import parser as pp

    cases = at_modifier_cases("sum(rate(a[5m])) + b", 3_000_000, pp.parse("sum(rate(a[5m])) + b"))
    assert {t for _, t in cases} == {-30_000_000, 0, 600_000, 3_000_000, 30_000_000}
    assert cases[0][0] == "sum(rate(a[5m] @ 3000.000)) + b @ 3000.000"
    assert [t for _, t in at_modifier_cases("a", 0, pp.parse("a"))] == [-1000, 0, 1000]
    assert at_modifier_cases("time() + a", 60_000, pp.parse("time() + a")) == []
    sub = at_modifier_cases("max_over_time(a[5m:1m])", 60_000, pp.parse("max_over_time(a[5m:1m])"))
    assert sub[0][0] == "max_over_time(a[5m:1m] @ 60.000)"  # selectors inside the subquery stay as they are


# ---------------------------------------------------------------------------------------------
# in-memory source


def test_memory_source_select_semantics():
    src = MemorySource()
    batch = SampleBatch.from_series([
        ((("__name__", "m"), ("job", "b")), np.array([0, 10, 20]), np.array([1.0, STALE_NAN, 3.0])),
        ((("__name__", "m"), ("job", "a")), np.array([5, 15]), np.array([4.0, 5.0])),
        ((("__name__", "n"),), np.array([0]), np.array([9.0])),
    ])
    src.append(batch)
    ss = src.select([Matcher("__name__", "=", "m")], 0, 20)
    assert [dict(l)["job"] for l in ss.labels] == ["a", "b"]  # sorted by labels
    assert ss.offsets.tolist() == [0, 2, 5]
    assert ss.timestamps.tolist() == [5, 15, 0, 10, 20]
    assert is_stale(ss.values).tolist() == [False, False, False, True, False]  # stale kept bit-exact
    # inclusive bounds, series without samples in range dropped
    ss = src.select([Matcher("__name__", "=~", "m|n")], 10, 15)
    assert [l for l in ss.labels] == [(("__name__", "m"), ("job", "a")), (("__name__", "m"), ("job", "b"))]
    assert ss.timestamps.tolist() == [15, 10]
    # a matcher that matches "" also selects series lacking the label
    ss = src.select([Matcher("job", "!~", "a|b")], -100, 100)
    assert ss.labels == [(("__name__", "n"),)]
    ss = src.select([Matcher("job", "=", "")], -100, 100)
    assert ss.labels == [(("__name__", "n"),)]
    # later writes of the same timestamp win; additive loads merge
    src.add_series((("__name__", "n"),), [0, 30], [7.0, 8.0])
    ss = src.select([Matcher("__name__", "=", "n")], -100, 100)
    assert ss.timestamps.tolist() == [0, 30] and ss.values.tolist() == [7.0, 8.0]
    assert len(src.select([Matcher("__name__", "=", "zzz")], 0, 100)) == 0


# ---------------------------------------------------------------------------------------------
# end to end through the real engine: the runner catches mutated expectations

BASE = """
load 1m
    m{job="a"} 1+1x10
    m{job="b"} 10+10x10
"""


def _run(script: str) -> list:
    return FileRunner(storage="memory").run_text("inline.test", script)


@needs_engine
def test_runner_control_script_passes():
    outs = _run(BASE + """
eval instant at 5m m
    m{job="a"} 6
    m{job="b"} 60

eval range from 0 to 2m step 1m m{job="a"}
    m{job="a"} 1 2 3

eval instant at 5m sort_desc(m)
    expect ordered
    m{job="b"} 60
    m{job="a"} 6

eval instant at 5m sum(m)
    {} 66
""")
    assert [o.status for o in outs] == ["pass"] * 4, [o.message for o in outs]


@needs_engine
@pytest.mark.parametrize("body,needle", [
    ('eval instant at 5m m\n    m{job="a"} 7\n    m{job="b"} 60\n', "expected 7"),  # changed value
    ('eval instant at 5m m\n    m{job="a"} 6\n', "unexpected metric"),  # dropped expected series
    ('eval instant at 5m m\n    m{job="a"} 6\n    m{job="b"} 60\n    m{job="c"} 1\n', "not found"),  # extra series
    ('eval instant at 5m sort_desc(m)\n    expect ordered\n    m{job="a"} 6\n    m{job="b"} 60\n', "position"),  # order
    ('eval range from 0 to 2m step 1m m{job="a"}\n    m{job="a"} 1 2 4\n', "to be 4"),  # range value
    ('eval range from 0 to 2m step 1m m{job="a"}\n    m{job="a"} 1 _ 3\n', "float points"),  # missing point
    ('eval instant at 5m m\n    {job="a"} 6\n    {job="b"} 60\n', "unexpected metric"),  # name dropped wrongly
    ('eval instant at 5m m + 1\n    expect fail\n', "expected error"),  # a failure that does not happen
])
def test_runner_reports_mutations(body: str, needle: str):
    outs = _run(BASE + "\n" + body)
    assert len(outs) == 1 and outs[0].status == "fail", outs
    assert needle in outs[0].message, outs[0].message


@needs_engine
def test_runner_reports_wrong_error_message():
    ok = _run(BASE + '\neval instant at 5m label_replace(m, "job", "a", "", "")\n'
              "    expect fail regex: same labelset\n")
    assert ok[0].status == "pass", ok[0].message
    bad = _run(BASE + '\neval instant at 5m label_replace(m, "job", "a", "", "")\n'
               "    expect fail msg: this is not the message\n")
    assert bad[0].status == "fail" and "expected error" in bad[0].message, bad[0].message


@needs_engine
def test_cli_output_and_exit_status(tmp_path):
    """`python -m promql.promqltest FILE` prints one line per failure, per-file counts, the exact
    closing line, and exits non-zero when a stable eval fails."""
    import subprocess
    import sys

    from tests.helpers import REPO

    good = tmp_path / "good.test"
    good.write_text(BASE + '\neval instant at 5m m{job="a"}\n    m{job="a"} 6\n\n'
                    "eval instant at 5m limitk(1, m)\n    expect ordered\n    m{job=\"a\"} 6\n\n"
                    "eval instant at 5m m[1m+1s]\n")
    bad = tmp_path / "bad.test"
    bad.write_text(BASE + '\neval instant at 5m m{job="a"}\n    m{job="a"} 7\n')
    for path, code, closing in ((good, 0, "1 passed, 0 failed, 2 skipped"), (bad, 1, "0 passed, 1 failed, 0 skipped")):
        r = subprocess.run([sys.executable, "-m", "promql.promqltest", "--storage", "memory", str(path)],
                           cwd=REPO, capture_output=True, text=True, timeout=120)
        lines = r.stdout.strip().splitlines()
        assert r.returncode == code, r.stdout + r.stderr
        assert lines[-1] == closing, r.stdout
        assert any(l.startswith(f"{path.name}: plain ") for l in lines)
        if code:
            assert any(l.startswith(f"FAIL {path.name}:") and "expected 7" in l for l in lines), r.stdout
