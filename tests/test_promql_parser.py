"""TurboProm's PromQL parser (promql/parser/) against Prometheus 3.x.

* Broken queries: each gives Prometheus 3.x's exact error text and ``line:col``
  (``PARSE_TEST_CASES``: the failing inputs of Prometheus's ``promql/parser/parse_test.go`` with the
  first error it expects; ``TYPO_CASES``: mistakes people make, answered identically by Prometheus
  2.42 and by 3.x's rules). Checked on the parser, and through ``/api/v1/query`` of a real server
  (``invalid parameter "query": <message>``, 400, bad_data, as Prometheus answers).
* 3.x syntax parses: duration expressions, ``anchored``/``smoothed``, ``info()``, ``limitk``,
  ``fill`` modifiers, UTF-8 quoted names, negative ``@`` times, hex/inf/nan, ``1h30m``, Go escapes.
* Positions: every node carries its ``(start, end)`` range.
"""
from __future__ import annotations

import datetime as dt
import json
import math
import urllib.error
import urllib.parse
import urllib.request

import pytest

from promql.parser import (
    AggregateExpr,
    AtModifierType,
    BinaryExpr,
    Call,
    DurationExpr,
    MatrixSelector,
    NumberLiteral,
    ParseError,
    StringLiteral,
    SubqueryExpr,
    UnaryExpr,
    VectorSelector,
    parse,
)
from promql.ast_walk import walk
from tests.helpers import ServerProcess

# From Prometheus's promql/parser/parse_test.go (3.x): input -> first error.
PARSE_TEST_CASES = [
    ('', 'unknown position: parse error: no expression found in input'),
    ('# just a comment\n\n', '1:1: parse error: no expression found in input'),
    ('1+', '1:3: parse error: unexpected end of input'),
    ('.', "1:1: parse error: unexpected character: '.'"),
    ('2.5.', '1:1: parse error: bad number or duration syntax: "2.5."'),
    ('100..4', '1:1: parse error: bad number or duration syntax: "100.."'),
    ('0deadbeef', '1:1: parse error: bad number or duration syntax: "0de"'),
    ('1 /', '1:4: parse error: unexpected end of input'),
    ('*1', '1:1: parse error: unexpected <op:*>'),
    ('(1))', "1:5: parse error: unexpected right parenthesis ')'"),
    ('((1)', '1:5: parse error: unclosed left parenthesis'),
    ('(', '1:2: parse error: unclosed left parenthesis'),
    ('1 and 1', '1:1: parse error: set operator "and" not allowed in binary scalar expression'),
    ('1 == 1', '1:3: parse error: comparisons between scalars must use BOOL modifier'),
    ('1 or 1', '1:1: parse error: set operator "or" not allowed in binary scalar expression'),
    ('1 unless 1', '1:1: parse error: set operator "unless" not allowed in binary scalar expression'),
    ('1 !~ 1', "1:3: parse error: unexpected character after '!': '~'"),
    ('1 =~ 1', "1:3: parse error: unexpected character after '=': '~'"),
    ('-"string"', '1:1: parse error: unary expression only allowed on expressions of type scalar or instant vector, got "string"'),
    ('-test[5m]', '1:1: parse error: unary expression only allowed on expressions of type scalar or instant vector, got "range vector"'),
    ('*test', '1:1: parse error: unexpected <op:*>'),
    ('@@', '1:1: parse error: unexpected <op:@>'),
    ('1 offset 1d', '1:1: parse error: offset modifier must be preceded by an instant vector selector or range vector selector or a subquery'),
    ('foo offset 1s offset 2s', '1:1: parse error: offset may not be set multiple times'),
    ('a - on(b) ignoring(c) d', '1:11: parse error: unexpected <ignoring>'),
    ('foo and 1', '1:1: parse error: set operator "and" not allowed in binary scalar expression'),
    ('1 and foo', '1:1: parse error: set operator "and" not allowed in binary scalar expression'),
    ('foo or 1', '1:1: parse error: set operator "or" not allowed in binary scalar expression'),
    ('1 or foo', '1:1: parse error: set operator "or" not allowed in binary scalar expression'),
    ('foo unless 1', '1:1: parse error: set operator "unless" not allowed in binary scalar expression'),
    ('1 unless foo', '1:1: parse error: set operator "unless" not allowed in binary scalar expression'),
    ('1 or on(bar) foo', '1:1: parse error: vector matching only allowed between instant vectors'),
    ('foo == on(bar) 10', '1:1: parse error: vector matching only allowed between instant vectors'),
    ('foo + group_left(baz) bar', '1:7: parse error: unexpected <group_left>'),
    ('foo and on(bar) group_left(baz) bar', '1:1: parse error: no grouping allowed for "and" operation'),
    ('foo and on(bar) group_right(baz) bar', '1:1: parse error: no grouping allowed for "and" operation'),
    ('foo or on(bar) group_left(baz) bar', '1:1: parse error: no grouping allowed for "or" operation'),
    ('foo or on(bar) group_right(baz) bar', '1:1: parse error: no grouping allowed for "or" operation'),
    ('foo unless on(bar) group_left(baz) bar', '1:1: parse error: no grouping allowed for "unless" operation'),
    ('foo unless on(bar) group_right(baz) bar', '1:1: parse error: no grouping allowed for "unless" operation'),
    ('http_requests{group="production"} + on(instance) group_left(job,instance) cpu_count{type="smp"}', '1:35: parse error: label "instance" must not occur in ON and GROUP clause at once'),
    ('foo + bool bar', '1:5: parse error: bool modifier can only be used on comparison operators'),
    ('foo + bool 10', '1:5: parse error: bool modifier can only be used on comparison operators'),
    ('foo and bool 10', '1:5: parse error: bool modifier can only be used on comparison operators'),
    ('foo @ +Inf', '1:1: parse error: timestamp out of bounds for @ modifier: +Inf'),
    ('foo @ -Inf', '1:1: parse error: timestamp out of bounds for @ modifier: -Inf'),
    ('foo @ NaN', '1:1: parse error: timestamp out of bounds for @ modifier: NaN'),
    ('{', '1:2: parse error: unexpected end of input inside braces'),
    ('}', "1:1: parse error: unexpected character: '}'"),
    ('some{', '1:6: parse error: unexpected end of input inside braces'),
    ('some}', "1:5: parse error: unexpected character: '}'"),
    ('some_metric{a=b}', '1:15: parse error: unexpected identifier "b" in label matching, expected string'),
    ('some_metric{a:b="b"}', "1:14: parse error: unexpected character inside braces: ':'"),
    ('foo{a*"b"}', "1:6: parse error: unexpected character inside braces: '*'"),
    ('foo{a>="b"}', "1:6: parse error: unexpected character inside braces: '>'"),
    ('foo{gibberish}', '1:14: parse error: unexpected "}" in label matching, expected label matching operator'),
    ('foo{1}', "1:5: parse error: unexpected character inside braces: '1'"),
    ('{}', '1:1: parse error: vector selector must contain at least one non-empty matcher'),
    ('{x=""}', '1:1: parse error: vector selector must contain at least one non-empty matcher'),
    ('{x=~".*"}', '1:1: parse error: vector selector must contain at least one non-empty matcher'),
    ('{x!~".+"}', '1:1: parse error: vector selector must contain at least one non-empty matcher'),
    ('{x!="a"}', '1:1: parse error: vector selector must contain at least one non-empty matcher'),
    ('foo{__name__="bar"}', '1:1: parse error: metric name must not be set twice: "foo" or "bar"'),
    ('foo{__name__= =}', '1:15: parse error: unexpected "=" in label matching, expected string'),
    ('foo{,}', '1:5: parse error: unexpected "," in label matching, expected identifier or "}"'),
    ('foo{__name__ == "bar"}', '1:15: parse error: unexpected "=" in label matching, expected string'),
    ('foo{__name__="bar" lol}', '1:20: parse error: unexpected identifier "lol" in label matching, expected "," or "}"'),
    ('foo{"a"=}', '1:9: parse error: unexpected "}" in label matching, expected string'),
    ('foo[5mm]', '1:5: parse error: bad number or duration syntax: "5mm"'),
    ('foo[5m1]', '1:5: parse error: bad number or duration syntax: "5m1"'),
    ('foo[5m:1m1]', '1:8: parse error: bad number or duration syntax: "1m1"'),
    ('foo[5y1hs]', '1:5: parse error: unknown unit "hs" in duration "5y1hs"'),
    ('foo[5m1h]', '1:5: parse error: not a valid duration string: "5m1h"'),
    ('foo[5m1m]', '1:5: parse error: not a valid duration string: "5m1m"'),
    ('foo[0m]', '1:5: parse error: duration must be greater than 0'),
    ('foo["5m"]', '1:5: parse error: unexpected character in duration expression: \'"\''),
    ('foo[]', '1:5: parse error: unexpected "]" in subquery or range selector, expected number, duration, step(), or range()'),
    ('foo[-1]', '1:5: parse error: duration must be greater than 0'),
    ('some_metric[5m] OFFSET 1mm', '1:24: parse error: bad number or duration syntax: "1mm"'),
    ('some_metric[5m] OFFSET', '1:23: parse error: unexpected end of input in offset, expected number, duration, step(), or range()'),
    ('some_metric OFFSET 1m[5m]', '1:22: parse error: no offset modifiers allowed before range'),
    ('some_metric[5m] @', '1:18: parse error: unexpected end of input in @, expected timestamp'),
    ('some_metric @ 1234 [5m]', '1:20: parse error: no @ modifiers allowed before range'),
    ('some_metric @ start() [5m]', '1:23: parse error: no @ modifiers allowed before range'),
    ('some_metric @ end()[5m]', '1:20: parse error: no @ modifiers allowed before range'),
    ('some_metric offset step()[5m]', '1:26: parse error: no offset modifiers allowed before range'),
    ('(foo + bar)[5m]', '1:12: parse error: ranges only allowed for vector selectors'),
    ('sum by ("foo)(some_metric{})', '1:9: parse error: unterminated quoted string'),
    ('sum without(==)(some_metric)', '1:13: parse error: unexpected <op:==> in grouping opts, expected label'),
    ('sum without(,)(some_metric)', '1:13: parse error: unexpected "," in grouping opts, expected label'),
    ('sum without(foo,,)(some_metric)', '1:17: parse error: unexpected "," in grouping opts, expected label'),
    ('sum some_metric by (test)', '1:5: parse error: unexpected identifier "some_metric"'),
    ('sum (some_metric) by test', '1:22: parse error: unexpected identifier "test" in grouping opts, expected "("'),
    ('sum () by (test)', '1:1: parse error: no arguments for aggregate expression provided'),
    ('MIN keep_common (some_metric)', '1:5: parse error: unexpected identifier "keep_common"'),
    ('MIN (some_metric) keep_common', '1:19: parse error: unexpected identifier "keep_common"'),
    ('sum (some_metric) without (test) by (test)', '1:34: parse error: unexpected <by>'),
    ('sum without (test) (some_metric) by (test)', '1:34: parse error: unexpected <by>'),
    ('topk(some_metric)', '1:1: parse error: wrong number of arguments for aggregate expression provided, expected 2, got 1'),
    ('topk(some_metric,)', '1:17: parse error: trailing commas not allowed in function call args'),
    ('topk(some_metric, other_metric)', '1:6: parse error: expected type scalar in aggregation parameter, got instant vector'),
    ('count_values(5, other_metric)', '1:14: parse error: expected type string in aggregation parameter, got scalar'),
    ('rate(some_metric[5m]) @ 1234', '1:1: parse error: @ modifier must be preceded by an instant vector selector or range vector selector or a subquery'),
    ('floor()', '1:1: parse error: expected 1 argument(s) in call to "floor", got 0'),
    ('floor(some_metric, other_metric)', '1:1: parse error: expected 1 argument(s) in call to "floor", got 2'),
    ('floor(some_metric, 1)', '1:1: parse error: expected 1 argument(s) in call to "floor", got 2'),
    ('floor(1)', '1:7: parse error: expected type instant vector in call to function "floor", got scalar'),
    ('hour(some_metric, some_metric, some_metric)', '1:1: parse error: expected at most 1 argument(s) in call to "hour", got 3'),
    ('time(some_metric)', '1:1: parse error: expected 0 argument(s) in call to "time", got 1'),
    ('non_existent_function_far_bar()', '1:1: parse error: unknown function with name "non_existent_function_far_bar"'),
    ('rate(some_metric)', '1:6: parse error: expected type range vector in call to function "rate", got instant vector'),
    ('-=', '1:2: parse error: unexpected "="'),
    ('++-++-+-+-<', '1:11: parse error: unexpected <op:<>'),
    ('e-+=/(0)', '1:4: parse error: unexpected "="'),
    ('a>b()', '1:3: parse error: unknown function with name "b"'),
    ('rate(avg)', '1:6: parse error: expected type range vector in call to function "rate", got instant vector'),
    ('`\\``', '1:4: parse error: unterminated raw string'),
    ('"\\', '1:1: parse error: escape sequence not terminated'),
    ('"\\c"', "1:1: parse error: unknown escape sequence U+0063 'c'"),
    ('"\\x."', "1:1: parse error: illegal character U+002E '.' in escape sequence"),
    ('foo{bar="baz"}[', '1:16: parse error: unexpected end of input in duration expression'),
    ('test[5d] OFFSET 10s [10m:5s]', '1:1: parse error: subquery is only allowed on instant vector, got matrix instead'),
    ('(foo + bar{nm="val"})[5m:][10m:5s]', '1:1: parse error: subquery is only allowed on instant vector, got matrix instead'),
    ('rate(food[1m])[1h] offset 1h', '1:15: parse error: ranges only allowed for vector selectors'),
    ('rate(food[1m])[1h] @ 100', '1:15: parse error: ranges only allowed for vector selectors'),
    ('info(rate(http_request_counter_total{}[5m]), target_info{foo="bar"})', '1:46: parse error: expected label selectors only, got vector selector instead'),
    ('info(http_request_counter_total{namespace="zzz"}, {foo="bar"} == 1)', '1:51: parse error: expected label selectors only'),
    ('foo[step]', '1:9: parse error: unexpected "]" in subquery or range selector, expected number, duration, step(), or range()'),
    ('foo[step()/0d]', '1:11: parse error: division by zero'),
    ('foo[5s/0d]', '1:7: parse error: division by zero'),
    ('foo offset (4d/0)', '1:15: parse error: division by zero'),
    ('foo[5s%0d]', '1:7: parse error: modulo by zero'),
    ('foo offset 9.5e10', '1:12: parse error: duration out of range'),
    ('foo[9.5e10]', '1:5: parse error: duration out of range'),
    ('sum(', '1:5: parse error: unclosed left parenthesis'),
    ('sum(rate(', '1:10: parse error: unclosed left parenthesis'),
    ('foo[5s x 5s]', "1:8: parse error: unexpected character: 'x', expected ':'"),
    ('foo[5s s 5s]', "1:8: parse error: unexpected character: 's', expected ':'"),
    ('1[5m] smoothed', '1:2: parse error: ranges only allowed for vector selectors'),
    ('1[5m] anchored', '1:2: parse error: ranges only allowed for vector selectors'),
]

# Typos people make, each answered the same by Prometheus 2.42 and by parse_test.go's rules for 3.x.
TYPO_CASES = [
    ('count(job="x")', '1:10: parse error: unexpected "=" in aggregation'),
    ('sum(up) by job', '1:12: parse error: unexpected identifier "job" in grouping opts, expected "("'),
    ('up @ foo', '1:6: parse error: unexpected identifier "foo" in @, expected timestamp'),
    ('1 +', '1:4: parse error: unexpected end of input'),
    ('sum(up) without', '1:16: parse error: unexpected end of input in grouping opts, expected "("'),
    ('sum(rate(http_requests_total[5m])', '1:34: parse error: unclosed left parenthesis'),
    ('rate(http_requests_total[5m]))', "1:31: parse error: unexpected right parenthesis ')'"),
    ('rate(http_requests_total{job="api"[5m])', "1:35: parse error: unexpected character inside braces: '['"),
    ('up{job="api"', '1:13: parse error: unexpected end of input inside braces'),
    ('up{job=api}', '1:8: parse error: unexpected identifier "api" in label matching, expected string'),
    ('up{job="api",,}', '1:14: parse error: unexpected "," in label matching, expected identifier or "}"'),
    ('up{job=~"api}', '1:9: parse error: unterminated quoted string'),
    ('up{job="api"}[5m', '1:17: parse error: unclosed left bracket'),
    ('sum by job (up)', '1:8: parse error: unexpected identifier "job" in grouping opts, expected "("'),
    ('sum(up) by (job', '1:16: parse error: unclosed left parenthesis'),
    ('topk(up, 5)', '1:10: parse error: expected type instant vector in aggregation expression, got scalar'),
    ('topk(5)', '1:1: parse error: wrong number of arguments for aggregate expression provided, expected 2, got 1'),
    ('rate(up)', '1:6: parse error: expected type range vector in call to function "rate", got instant vector'),
    ('rate(up[5m], 1)', '1:1: parse error: expected 1 argument(s) in call to "rate", got 2'),
    ('histogram_quantile(0.9, rate(x_bucket[5m])', '1:43: parse error: unclosed left parenthesis'),
    ('histogram_quantile(rate(x_bucket[5m]))', '1:1: parse error: expected 2 argument(s) in call to "histogram_quantile", got 1'),
    ('up offset 5x', '1:11: parse error: bad number or duration syntax: "5"'),
    ('up @', '1:5: parse error: unexpected end of input in @, expected timestamp'),
    ('up @ start', '1:11: parse error: unexpected end of input in @, expected timestamp'),
    ('up[5m:1m:1m]', "1:9: parse error: unexpected colon ':'"),
    ('sum(up) by (job) by (instance)', '1:18: parse error: unexpected <by>'),
    ('up and', '1:7: parse error: unexpected end of input'),
    ('up and on', '1:10: parse error: unexpected end of input in grouping opts, expected "("'),
    ('up + on job up', '1:9: parse error: unexpected identifier "job" in grouping opts, expected "("'),
    ('up > bool', '1:10: parse error: unexpected end of input'),
    ('up unless 1', '1:1: parse error: set operator "unless" not allowed in binary scalar expression'),
    ('sum()', '1:1: parse error: no arguments for aggregate expression provided'),
    ('max_over_time(up)', '1:15: parse error: expected type range vector in call to function "max_over_time", got instant vector'),
    ('abs()', '1:1: parse error: expected 1 argument(s) in call to "abs", got 0'),
    ('rat(up[5m])', '1:1: parse error: unknown function with name "rat"'),
    ('sum without (job) up', '1:19: parse error: unexpected identifier "up" in aggregation'),
    ('up}', "1:3: parse error: unexpected character: '}'"),
    ('{job=""}', '1:1: parse error: vector selector must contain at least one non-empty matcher'),
    ('up[0s]', '1:4: parse error: duration must be greater than 0'),
    ('up offset 5m offset 1m', '1:1: parse error: offset may not be set multiple times'),
    ('(up)[5m]', '1:5: parse error: ranges only allowed for vector selectors'),
    ('label_replace(up, "a", "b", "c")', '1:1: parse error: expected 5 argument(s) in call to "label_replace", got 4'),
    ('round(up, 1, 2)', '1:1: parse error: expected at most 2 argument(s) in call to "round", got 3'),
    ('avg_over_time(up[5m:1m]', '1:24: parse error: unclosed left parenthesis'),
    ('sum(up)[5m]', '1:8: parse error: ranges only allowed for vector selectors'),
    ('up @ 1 @ 2', '1:1: parse error: @ <timestamp> may not be set multiple times'),
    ('"foo" + 1', '1:1: parse error: binary expression must contain only scalar and instant vector types'),
    ('-"foo"', '1:1: parse error: unary expression only allowed on expressions of type scalar or instant vector, got "string"'),
    ('up ** 2', '1:5: parse error: unexpected <op:*>'),
    ('up =! 1', '1:4: parse error: unexpected "="'),
    ('up => 1', '1:4: parse error: unexpected "="'),
    ('up !~ 1', "1:4: parse error: unexpected character after '!': '~'"),
    ('up == bool', '1:11: parse error: unexpected end of input'),
    ('count_values(up)', '1:1: parse error: wrong number of arguments for aggregate expression provided, expected 2, got 1'),
    ('quantile(up)', '1:1: parse error: wrong number of arguments for aggregate expression provided, expected 2, got 1'),
    ('quantile("a", up)', '1:10: parse error: expected type scalar in aggregation parameter, got string'),
    ('sum(up,)', '1:7: parse error: trailing commas not allowed in function call args'),
    ('rate(up[5m],)', '1:12: parse error: trailing commas not allowed in function call args'),
    ('up[5m] @', '1:9: parse error: unexpected end of input in @, expected timestamp'),
    ('time() offset 5m', '1:1: parse error: offset modifier must be preceded by an instant vector selector or range vector selector or a subquery'),
    ('count by (job) (up) > ', '1:23: parse error: unexpected end of input'),
    ('sum(rate(up[5m])) by (job) ) ', "1:29: parse error: unexpected right parenthesis ')'"),
]

BROKEN = PARSE_TEST_CASES + TYPO_CASES


def test_table_size():
    assert len(BROKEN) >= 60 and len({q for q, _ in BROKEN}) == len(BROKEN)


@pytest.mark.parametrize("query,message", BROKEN)
def test_broken_query_message(query: str, message: str):
    with pytest.raises(ParseError) as ei:
        parse(query)
    assert str(ei.value) == message


@pytest.mark.parametrize("query", [
    "foo[5m+1m]", "foo[2 * 5m]", "foo[step()]", "foo[1h:step() * 2]", "foo offset -(1h)", "foo offset step()",
    "foo[max_of(5m, step())]", "foo offset -min_of(1m, 2m)", "foo[(5m)]", "foo[5m] anchored", "foo[5m] smoothed",
    "rate(foo[5m] anchored)", "info(rate(x[5m]), {k8s_cluster_name=~\".+\"})", "limitk(2, foo)",
    "limit_ratio(0.5, foo)", "a + fill(0) b", "a + fill_left(1) fill_right(-2) b", '{"my.metric", "a.b"="c"}',
    'sum by ("a.b") (x)', "foo @ start()", "foo @ end()", "foo @ -100", "foo[5m] @ -1.5", "0x1F + inf - NaN",
    "foo offset 1h30m", 'x{a="\\x41\\u00e9\\101"}', "histogram_quantiles(foo, \"q\", 0.5, 0.9)", "step()",
    "foo[5] offset 10", "a </ b", "- - 1", "sum(x) by (a,)", "x{a='b',}",
])
def test_3x_syntax_parses(query: str):
    parse(query)


def test_broken_queries_over_http(tmp_path):
    """Every broken query of the table through /api/v1/query (POST form, as Grafana sends it)."""
    wrong = []
    with ServerProcess(tmp_path / "data") as srv:
        for query, message in BROKEN:
            body = urllib.parse.urlencode({"query": query, "time": "100"}).encode()
            req = urllib.request.Request(srv.url + "/api/v1/query", data=body,
                                         headers={"Content-Type": "application/x-www-form-urlencoded"})
            try:
                with urllib.request.urlopen(req, timeout=30) as r:
                    status, got = r.status, json.loads(r.read())
            except urllib.error.HTTPError as e:
                status, got = e.code, json.loads(e.read())
            want = {"status": "error", "errorType": "bad_data", "error": f'invalid parameter "query": {message}'}
            if status != 400 or {k: got.get(k) for k in want} != want:
                wrong.append((query, status, got))
    assert not wrong, wrong[:5]


def test_values():
    e = parse("foo offset -(1h)")
    assert isinstance(e, VectorSelector) and e.offset is None and isinstance(e.offset_expr, DurationExpr)
    e = parse("foo @ -100.5")
    assert e.at.type == AtModifierType.At and e.at.ms == -100_500
    assert e.at.at == dt.datetime(1969, 12, 31, 23, 58, 19, 500000, tzinfo=dt.timezone.utc)
    e = parse("foo[1h30m]")
    assert isinstance(e, MatrixSelector) and e.range == dt.timedelta(minutes=90)
    e = parse("foo[1h:5m] offset 1m")
    assert isinstance(e, SubqueryExpr) and (e.range, e.step, e.offset) == (
        dt.timedelta(hours=1), dt.timedelta(minutes=5), dt.timedelta(minutes=1))
    assert parse("foo[1h:]").step is None
    assert parse("0x1F").val == 31 and math.isinf(parse("-Inf").val) and math.isnan(parse("nan").val)
    assert parse("010").val == 8  # Go's ParseInt base 0: octal
    assert parse('"a\\x41\\u00e9\\n"').val == "aAé\n"
    assert parse('"\\xff"').val.encode("utf-8", "surrogateescape") == b"\xff"  # Go keeps the byte
    e = parse('{"my.metric", a="b"}')
    assert e.name is None and [(m.name, m.value) for m in e.matchers.matchers] == [("__name__", "my.metric"), ("a", "b")]
    e = parse("sum without (a) (x)")
    assert isinstance(e, AggregateExpr) and str(e.op) == "sum" and e.modifier.labels == ["a"]
    e = parse("a and b")
    assert e.modifier.card.name == "ManyToMany"
    assert parse("1 + 2").modifier is None and parse("a + b").modifier is None
    e = parse("-foo")
    assert isinstance(e, UnaryExpr) and str(e.op) == "-"
    assert isinstance(parse("-1"), NumberLiteral) and parse("-1").val == -1
    assert str(parse("a AND b").op) == "and" and str(parse("SUM(a)").op) == "sum"
    e = parse("a + on(b) group_left(c) d")
    assert e.modifier.matching.labels == ["b"] and e.modifier.group_labels == ["c"]
    assert e.modifier.card.name == "ManyToOne"


def test_positions():
    q = 'sum by (job) (rate(http_requests_total{code="500"}[5m] offset 1m)) / 2'
    e = parse(q)
    assert isinstance(e, BinaryExpr) and e.pos == (0, len(q))
    agg = e.lhs
    assert isinstance(agg, AggregateExpr) and q[agg.pos[0]:agg.pos[1]] == q[:-4]
    call = agg.expr
    assert isinstance(call, Call) and q[call.pos[0]:call.pos[1]] == 'rate(http_requests_total{code="500"}[5m] offset 1m)'
    ms = call.args[0]
    assert isinstance(ms, MatrixSelector) and q[ms.pos[0]:ms.pos[1]] == 'http_requests_total{code="500"}[5m] offset 1m'
    assert q[e.rhs.pos[0]:e.rhs.pos[1]] == "2"
    s = parse('label_join(x, "a", ",", "b")').args[2]
    assert isinstance(s, StringLiteral) and s.pos == (19, 22)
    for n in walk(parse("max(rate(a[5m:1m] @ 10)) - -b")):
        assert 0 <= n.pos[0] <= n.pos[1]


def test_multi_line_position():
    with pytest.raises(ParseError) as ei:
        parse("sum(\n  rate(x[5m])\n) by job")
    assert str(ei.value) == '3:6: parse error: unexpected identifier "job" in grouping opts, expected "("'


def test_label_name_validity_is_prometheus_utf8():
    """One rule for label names written in queries (grouping labels, label_replace/label_join):
    Prometheus's ``utf8.ValidString``. ``"\\xff"`` decodes to a byte that is not UTF-8 (invalid);
    ``"\\ufffd"`` decodes to the replacement character, which is valid UTF-8 (valid)."""
    from promql.parser.literals import valid_label_name

    assert valid_label_name("job") and valid_label_name("k8s.pod/näme") and valid_label_name("\ufffd")
    assert not valid_label_name("") and not valid_label_name("\udcff")
    with pytest.raises(ParseError) as e:
        parse('sum by ("\\xff") (up)')
    assert str(e.value) == '1:9: parse error: invalid label name for grouping: "\\xff"'
    agg = parse('sum by ("\\ufffd", "a\\u00e9") (up)')
    assert isinstance(agg, AggregateExpr) and agg.modifier.labels == ["\ufffd", "a\u00e9"]
