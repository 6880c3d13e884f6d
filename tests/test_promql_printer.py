"""The PromQL printer (promql/printer.py) against Prometheus's ``expr.String()`` rules.

Round trip: for every query of the conformance files (../shared/promqltest) and every expansion
of the compliance tester's query list (../shared/compliance/promql-test-queries.yml),
print(parse(print(parse(q)))) == print(parse(q)), and the reprinted query parses to the same
tree shape. Plus exact renderings of the constructs whose printing Prometheus defines.
"""
from __future__ import annotations

import re

from promql import parser as pp
import pytest

from tests.helpers import SHARED, load_bench

from storage.go_format import format_float_f as format_float
from promql.printer import format_duration_ms, go_quote, to_promql
from promql.promqltest_script import EvalCmd, parse_script

def compliance_queries() -> list[str]:
    """The compliance tester's 539 queries, expanded by the same code the side-by-side bench uses."""
    return [c.query for c in load_bench("compliance").expand_cases()]


def conformance_queries() -> list[str]:
    out = []
    for path in sorted((SHARED / "promqltest").glob("*.test")):
        for cmd in parse_script(path.read_text()):
            if isinstance(cmd, EvalCmd):
                out.append(cmd.expr)
    return out


def _shape(e) -> str:
    """Node types in pre-order: the reprinted query must have the same tree."""
    from promql.ast_walk import walk

    return " ".join(type(n).__name__ for n in walk(e))


def _parsable(qs: list[str]) -> list[str]:
    good = []
    for q in dict.fromkeys(qs):
        try:
            pp.parse(q)
        except pp.ParseError:  # queries the corpus expects to fail (eval_fail)
            continue
        good.append(q)
    return good


def test_compliance_expansion_size():
    assert len(compliance_queries()) == 539  # NOTES.md: 118 templates -> 539 queries


@pytest.mark.parametrize("source", ["conformance", "compliance"])
def test_round_trip(source: str):
    qs = _parsable(conformance_queries() if source == "conformance" else compliance_queries())
    assert len(qs) == (1753 if source == "conformance" else 538)  # every distinct query (one compliance query is invalid)
    bad = []
    for q in qs:
        e1 = pp.parse(q)
        p1 = to_promql(e1)
        try:
            e2 = pp.parse(p1)
        except Exception as ex:  # noqa: BLE001
            bad.append((q, p1, f"reprint does not parse: {ex}"))
            continue
        p2 = to_promql(e2)
        if p1 != p2:
            bad.append((q, p1, p2))
        elif _shape(e1) != _shape(e2):
            bad.append((q, p1, "tree shape changed"))
        # the @-injected form (the runner's step-invariance re-run) must parse too
        try:
            pp.parse(to_promql(e1, inject_at_ms=123_456))
        except Exception as ex:  # noqa: BLE001
            bad.append((q, to_promql(e1, inject_at_ms=123_456), f"@ form does not parse: {ex}"))
    assert not bad, bad[:10]


@pytest.mark.parametrize("query,printed", [
    ("foo", "foo"),
    ('foo{a="b", c=~"d.*"}', 'foo{a="b",c=~"d.*"}'),
    ('{__name__="foo", a!="b"}', '{__name__="foo",a!="b"}'),
    ('{"my.metric", "a.b"="c"}', '{"a.b"="c",__name__="my.metric"}'),
    ("foo offset 5m", "foo offset 5m"),
    ("foo offset -90m", "foo offset -1h30m"),
    ("foo @ 100", "foo @ 100.000"),
    ("foo @ 100 offset 1m", "foo @ 100.000 offset 1m"),
    ("foo offset 1m @ 100", "foo @ 100.000 offset 1m"),
    ("foo @ start()", "foo @ start()"),
    ("rate(foo[5m] @ end() offset 1w)", "rate(foo[5m] @ end() offset 1w)"),
    ("foo[7d]", "foo[1w]"),
    ("foo[8d]", "foo[8d]"),
    ("foo[365d]", "foo[1y]"),
    ("foo[1500ms]", "foo[1s500ms]"),
    ("foo[10]", "foo[10s]"),
    ("max_over_time(foo[5m:])", "max_over_time(foo[5m:])"),
    ("foo[5m:30s] offset 1m", "foo[5m:30s] offset 1m"),
    ("sum by (a, b) (foo)", "sum by (a, b) (foo)"),
    ("sum(foo) by (a)", "sum by (a) (foo)"),
    ("sum without () (foo)", "sum without () (foo)"),
    ("sum by () (foo)", "sum(foo)"),
    ("topk(3, foo)", "topk(3, foo)"),
    ('count_values("v", foo)', 'count_values("v", foo)'),
    ("quantile(0.9, foo)", "quantile(0.9, foo)"),
    ("a + on (x) group_left (y) b", "a + on (x) group_left (y) b"),
    ("a + on() b", "a + on () b"),
    ("a * ignoring(x) group_right b", "a * ignoring (x) group_right () b"),
    ("a + ignoring() b", "a + b"),
    ("a > bool 1", "a > bool 1"),
    ("a and on(x) b", "a and on (x) b"),
    ("a or b", "a or b"),
    ("(1 + 2) * 3", "(1 + 2) * 3"),
    ("-foo", "-foo"),
    ("2 ^ -1", "2 ^ -1"),
    ("1e20", "100000000000000000000"),
    ("0x10", "16"),
    ("+Inf", "+Inf"),
    ("-Inf", "-Inf"),
    ("NaN", "NaN"),
    ("1.5e-7", "0.00000015"),
    ('label_replace(foo, "dst", "$1", "src", "(.*)\\\\n")', 'label_replace(foo, "dst", "$1", "src", "(.*)\\\\n")'),
    ('"a\\tb"', '"a\\tb"'),
    ("time()", "time()"),
    ("+foo", "+foo"),
    ("predict_linear(foo[1h], 50m)", "predict_linear(foo[1h], 50m)"),
    ("foo[5m+1m]", "foo[5m + 1m]"),
    ("foo[2 * (5m)]", "foo[2 * (5m)]"),
    ("foo[1h:step()]", "foo[1h:step()]"),
    ("foo[max_of(step(), 5m):min_of(1m, range())]", "foo[max_of(step(), 5m):min_of(1m, range())]"),
    ("foo offset -(1h)", "foo offset -(1h)"),
    ("foo offset step()", "foo offset step()"),
    ("rate(foo[5m] anchored)", "rate(foo[5m] anchored)"),
    ("foo[5m] smoothed offset 1m", "foo[5m] smoothed offset 1m"),
    ("foo smoothed", "foo smoothed"),
    ("foo @ -100", "foo @ -100.000"),
    ("foo[5m] @ -1.5", "foo[5m] @ -1.500"),
    ("a + fill(0) b", "a + fill (0) b"),
    ("a + fill_left(1) fill_right(-2) b", "a + fill_left (1) fill_right (-2) b"),
    ("limitk(2, foo)", "limitk(2, foo)"),
    ('info(foo, {k8s_cluster=~".+"})', 'info(foo, {k8s_cluster=~".+"})'),
    ('sum by ("a.b") (foo)', 'sum by ("a.b") (foo)'),
    ("a AND b", "a and b"),
    ("SUM(foo)", "sum(foo)"),
])
def test_exact_rendering(query: str, printed: str):
    assert to_promql(pp.parse(query)) == printed


def test_helpers():
    assert format_duration_ms(0) == "0s"
    assert format_duration_ms(90 * 86_400_000) == "90d"  # not 12w6d
    assert format_duration_ms(14 * 86_400_000) == "2w"
    assert format_float(-0.0) == "-0"
    assert format_float(3.0) == "3"
    assert format_float(0.1) == "0.1"
    assert go_quote('a"b\\c\n\x01é') == '"a\\"b\\\\c\\n\\x01é"'


def test_inject_at_skips_inside_subqueries_and_existing_at():
    e = pp.parse("rate(a[5m]) + max_over_time(b[10m:1m]) + c @ 50 + sum_over_time(d[5m:] @ 10)")
    assert to_promql(e, inject_at_ms=3_000_000) == (
        "rate(a[5m] @ 3000.000) + max_over_time(b[10m:1m] @ 3000.000) + c @ 50.000 + sum_over_time(d[5m:] @ 10.000)"
    )
    assert re.search(r"@ -30\.000", to_promql(pp.parse("a"), inject_at_ms=-30_000))


def test_invalid_utf8_bytes_in_string_literals_survive():
    q = 'label_replace(m, "\\xff", "", "src", "(.*)") + count_values("a\\xc5z", m)'
    assert to_promql(pp.parse(q)) == q  # Go keeps the bytes and quotes them back as \xNN
