"""Alert label/annotation templates (planner/alert_template.py, planner/go_template.py) against the outputs Prometheus
documents for its template functions (template/template_test.go's expectations) and Go's
text/template behaviour that rule files rely on."""
from __future__ import annotations

import math

import pytest

from planner.alert_template import Context, Sample, execute, expand
from planner.go_template import TemplateError, go_float_g, go_sprintf

EXT = Context(external_url="http://testhost:9090/path/prefix")


def run(text: str, data=None, query_result: list[Sample] | None = None) -> str:
    ctx = Context(query=(lambda q: list(query_result or [])), external_url=EXT.external_url)
    return execute(text, data, {}, ctx)


@pytest.mark.parametrize("text,data,want", [
    ("{{ range . }}{{ humanize . }}:{{ end }}", [0.0, 1.0, 1234567.0, .12], "0:1:1.235M:120m:"),
    ("{{ range . }}{{ humanize . }}:{{ end }}", ["0.0", "1.0", "1234567.0", ".12"], "0:1:1.235M:120m:"),
    ("{{ range . }}{{ humanize . }}:{{ end }}", [0, -1, 1, 1234567, 2**63 - 1], "0:-1:1:1.235M:9.223E:"),
    ("{{ range . }}{{ humanize1024 . }}:{{ end }}", [0.0, 1.0, 1048576.0, .12], "0:1:1Mi:0.12:"),
    ("{{ range . }}{{ humanize1024 . }}:{{ end }}", [0, -1, 1, 1234567, 2**63 - 1], "0:-1:1:1.177Mi:8Ei:"),
    ("{{ range . }}{{ humanizeDuration . }}:{{ end }}",
     [0, 1, 60, 3600, 86400, 86400 + 3600, -(86400 * 2 + 3600 * 3 + 60 * 4 + 5), 899.99],
     "0s:1s:1m 0s:1h 0m 0s:1d 0h 0m 0s:1d 1h 0m 0s:-2d 3h 4m 5s:14m 59s:"),
    ("{{ range . }}{{ humanizeDuration . }}:{{ end }}", [.1, .0001, .12345, 60.1, 60.5, 1.2345, 12.345],
     "100ms:100us:123.5ms:1m 0s:1m 0s:1.234s:12.35s:"),
    ("{{ range . }}{{ humanizeDuration . }}:{{ end }}", [0, -1, 1, 1234567], "0s:-1s:1s:14d 6h 56m 7s:"),
    ("{{ range . }}{{ humanize . }}:{{ humanize1024 . }}:{{ humanizeDuration . }}:{{humanizeTimestamp .}}:{{ end }}",
     [math.inf, -math.inf, math.nan], "+Inf:+Inf:+Inf:+Inf:-Inf:-Inf:-Inf:-Inf:NaN:NaN:NaN:NaN:"),
    ("{{ -0.22222 | humanizePercentage }}:{{ 0.0 | humanizePercentage }}:{{ 0.1234567 | humanizePercentage }}:"
     "{{ 1.23456 | humanizePercentage }}", None, "-22.22%:0%:12.35%:123.5%"),
    ("{{ range . }}{{ humanizePercentage . }}:{{ end }}", [0, -1, 1, 1234567, 2**63 - 1],
     "0%:-100%:100%:1.235e+08%:9.223e+20%:"),
    ("{{ range . }}{{ humanizeTimestamp . }}:{{ end }}", [0, -1, 1, 1234567],
     "1970-01-01 00:00:00 +0000 UTC:1969-12-31 23:59:59 +0000 UTC:1970-01-01 00:00:01 +0000 UTC:"
     "1970-01-15 06:56:07 +0000 UTC:"),
    ("{{ 1435065584.128 | humanizeTimestamp }}", None, "2015-06-23 13:19:44.128 +0000 UTC"),
    ('{{ "aa bb CC" | title }}', None, "Aa Bb CC"),
    ('{{ "aa bb CC" | toUpper }}', None, "AA BB CC"),
    ('{{ "aA bB CC" | toLower }}', None, "aa bb cc"),
    ('{{ match "a+" "aa" }} {{ match "a+" "b" }}', None, "true false"),
    ('{{ reReplaceAll "(a)b" "x$1" "ab" }}', None, "xa"),
    ('{{ graphLink "up" }}', None, "/graph?g0.expr=up&g0.tab=0"),
    ('{{ tableLink "up" }}', None, "/graph?g0.expr=up&g0.tab=1"),
    ("{{ pathPrefix }}", None, "/path/prefix"),
    ("{{ externalURL }}", None, "http://testhost:9090/path/prefix"),
    ('{{ printf "%0.2f" (parseDuration "1h2m10ms") }}', None, "3720.01"),
    ('{{ "foo.example.com:12345" | stripPort }}|{{ "192.0.2.1" | stripPort }}|{{ "[2001:0DB8::1]:12345" | stripPort }}'
     '|{{ "2001:0DB8::1" | stripPort }}|{{ "[2001:0DB8::1]::12345" | stripPort }}', None,
     "foo.example.com|192.0.2.1|2001:0DB8::1|2001:0DB8::1|[2001:0DB8::1]::12345"),
    ('{{ "foo.example.com:12345" | stripDomain }}|{{ "foo.example.com" | stripDomain }}|{{ "192.0.2.1:12345" | stripDomain }}',
     None, "foo:12345|foo|192.0.2.1:12345"),
    ("{{ .Foo }}", None, "<no value>"),
    ("1 {{ if eq 1 1 }}yes{{ else }}no{{ end }} {{ if and true false }}a{{ else if or false 1 }}b{{ end }}", None, "1 yes b"),
    ("{{- range $i, $v := . -}} {{ $i }}={{ $v }} {{- end }}", ["x", "y"], "0=x1=y"),
    ("{{ with $x := 3 }}{{ $x }}{{ end }}{{ $y := 1 }}{{ $y = 2 }}{{ $y }}{{/* a comment */}}", None, "32"),
    ('{{ len . }} {{ index . 1 }} {{ print 1 2 "a" "b" 3 }}', [5, 6], '2 6 1 2ab3'),
])
def test_documented_outputs(text, data, want):
    assert run(text, data) == want


def test_query_functions():
    res = [Sample({"__name__": "metric", "instance": "b"}, 21.0), Sample({"__name__": "metric", "instance": "a"}, 11.0)]
    assert run('{{ range query "metric" | sortByLabel "instance" }}{{.Labels.instance}}:{{.Value}}: {{end}}',
               query_result=res) == "a:11: b:21: "
    assert run('{{ query "metric" | first | value }} {{ with query "metric" }}{{ . | first | label "instance" }}{{ end }}',
               query_result=res) == "21 b"
    assert run('{{ $x := query "metric" | first }}{{ $x.Labels.foo }}', query_result=res) == ""
    with pytest.raises(TemplateError, match=r"first\(\) called on vector with no elements"):
        run('{{ query "missing" | first }}', query_result=[])
    with pytest.raises(TemplateError, match="unclosed action"):
        run("{{")


def test_alert_expansion_variables_and_errors():
    labels = {"__name__": "up", "instance": "a:1", "job": "api"}
    got = expand("{{ $labels.instance }} of {{ .Labels.job }} is {{ $value }} ({{ $externalLabels.dc }}) {{ $externalURL }}",
                 "A", labels, 0.25, {"dc": "eu"}, Context(external_url="http://tp:9090"))
    assert got == "a:1 of api is 0.25 (eu) http://tp:9090"
    assert expand("{{ $labels.missing }}", "A", labels, 1.0, {}, EXT) == ""
    # Go refuses to compare a float64 with an int constant: the text says so instead of failing the rule.
    bad = expand("{{ if gt $value 4 }}x{{ end }}", "A", labels, 5.0, {}, EXT)
    assert bad.startswith("<error expanding template: ") and "incompatible types for comparison" in bad
    assert expand('{{ humanize "one" }}', "A", labels, 1.0, {}, EXT).endswith(
        'error calling humanize: strconv.ParseFloat: parsing "one": invalid syntax>')


@pytest.mark.parametrize("v,want", [(5.0, "5"), (0.1, "0.1"), (123456.0, "123456"), (1234567.0, "1.234567e+06"),
                                    (1e21, "1e+21"), (0.0001, "0.0001"), (0.00001, "1e-05"), (-2.5, "-2.5"),
                                    (math.nan, "NaN"), (-math.inf, "-Inf")])
def test_go_float_formatting(v, want):
    assert go_float_g(v) == want


def test_printf_verbs():
    assert go_sprintf("%s=%d %.1f%% %v %q %5.2f|%-4s|", "a", 3, 12.34, 2.0, "x\"y", 3.14159, "ab") == \
        'a=3 12.3% 2 "x\\"y"  3.14|ab  |'
    assert go_sprintf("%d") == "%!d(MISSING)"
