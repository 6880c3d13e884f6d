"""Text exposition / OpenMetrics parser: edge cases, and agreement with prometheus_client's
reference parser on the real node exporter's /metrics."""
from __future__ import annotations

import math
import subprocess
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from ingest.errors import IngestError
from ingest.text_format import parse_series_key, parse_text
from ingest.text_import import TextImporter
from ingest.validation import set_name_validation_scheme
from tests.helpers import free_port, require_binary, wait_http


def rows(body: str) -> list[tuple[dict, float, int | None]]:
    p = parse_text(body.encode())
    out = []
    for i in range(len(p)):
        lbl = dict(parse_series_key(p.keys[p.series_index[i]]))
        out.append((lbl, float(p.values[i]), int(p.timestamps[i]) if p.has_ts[i] else None))
    return out


def test_edge_cases():
    body = ('# HELP m A \\\\ backslash and a \\n newline.\n# TYPE m gauge\n'
            'm{a="x,y}z",b="q\\"uote",c="back\\\\slash",d="new\\nline",} -1.5e-3 -5\n'
            '  m{a="2"}   +Inf\n'
            'm{a="3"} NaN 1700000000000\n'
            '\n'
            'other_metric 0\n'
            '# a free comment\n')
    r = rows(body)
    assert r[0] == ({"__name__": "m", "a": "x,y}z", "b": 'q"uote', "c": "back\\slash", "d": "new\nline"}, -1.5e-3, -5)
    assert r[1][0] == {"__name__": "m", "a": "2"} and math.isinf(r[1][1]) and r[1][2] is None
    assert math.isnan(r[2][1]) and r[2][2] == 1700000000000
    assert r[3] == ({"__name__": "other_metric"}, 0.0, None)
    meta = parse_text(body.encode()).metadata
    assert meta[0].help == "A \\ backslash and a \n newline." and meta[0].type == "gauge"


def test_openmetrics_seconds_exemplars_eof():
    body = ('# TYPE rpc histogram\n# UNIT rpc seconds\n'
            'rpc_bucket{le="0.5"} 3 1700000000.250 # {trace_id="abc"} 0.3 1700000000.1\n'
            'rpc_count 3\n# EOF\n')
    p = parse_text(body.encode())
    assert p.timestamps[0] == 1700000000250 and p.values[0] == 3.0 and not p.has_ts[1]
    assert p.metadata[0].unit == "seconds" and p.metadata[0].type == "histogram"
    with pytest.raises(IngestError, match="after '# EOF'"):
        parse_text(b"a 1\n# EOF\nb 2\n", openmetrics=True)
    with pytest.raises(IngestError, match="EOF"):
        parse_text(b"a 1\n", openmetrics=True)


@pytest.mark.parametrize("body,needle", [
    (b"ok 1\nbad{a=\"1\" 2\n", "line 2"),
    (b"ok 1\n\nnot a number\n", "line 3"),
    (b"x{a=1} 2\n", "line 1"),
    (b"# TYPE x nonsense\nx 1\n", "unknown metric type"),
    (b"ok 1\nx{a=\"1\",a=\"2\"} 1\n", "line 2: duplicate label name"),
    (b"ok 1\nok{bad-name=\"1\"} 1\n", "line 2"),
])
def test_errors_name_the_line(body, needle):
    with pytest.raises(IngestError) as e:
        TextImporter().to_batch(body)
    assert needle in e.value.message and e.value.status == 400


@pytest.mark.peer
def test_agrees_with_reference_parser_on_node_exporter():
    ne = require_binary("prometheus-node-exporter")
    port = free_port()
    proc = subprocess.Popen([ne, f"--web.listen-address=127.0.0.1:{port}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_http(f"http://127.0.0.1:{port}/metrics", 30, proc)
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()
    finally:
        proc.terminate()
        proc.wait(10)
    ours = sorted((tuple(sorted(l.items())), repr(v)) for l, v, _ in rows(body))
    ref = sorted((tuple(sorted({"__name__": s.name, **s.labels}.items())), repr(float(s.value)))
                 for fam in text_string_to_metric_families(body) for s in fam.samples)
    assert len(ours) > 200 and ours == ref


def test_quoted_utf8_names():
    """Text format 1.0 / OpenMetrics with UTF-8 names (what exporters send for escaping=allow-utf-8)."""
    body = ('# HELP "gpu.util" GPU \\\\ utilisation\n# TYPE "gpu.util" gauge\n'
            '{"gpu.util", "k8s.pod"="p-0", job="x"} 0.5\n'
            '{"gpu.util","k8s.pod"="p-1"} 0.25 1700000000000\n'
            'plain{"esc\\"aped"="v"} 1\n').encode()
    parsed = parse_text(body)
    pairs = [parse_series_key(k) for k in parsed.keys]
    assert pairs == [(("__name__", "gpu.util"), ("k8s.pod", "p-0"), ("job", "x")),
                     (("__name__", "gpu.util"), ("k8s.pod", "p-1")),
                     (("__name__", "plain"), ('esc"aped', "v"))]
    assert parsed.values.tolist() == [0.5, 0.25, 1.0]
    (meta,) = parsed.metadata
    assert (meta.metric_family, meta.type, meta.help) == ("gpu.util", "gauge", "GPU \\ utilisation")
    for bad, needle in [('{job="x"} 1\n', "without a metric name"), ('{} 1\n', "without a metric name"),
                        ('{"a" "b"} 1\n', "without a metric name"), ('x{"" = "v"} 1\n', "invalid label name")]:
        with pytest.raises(IngestError, match=needle):
            TextImporter().to_batch(bad.encode())


def test_quoted_names_refused_under_legacy_scheme():
    set_name_validation_scheme("legacy")
    try:
        with pytest.raises(IngestError, match="invalid metric name 'gpu.util'"):
            TextImporter().to_batch(b'{"gpu.util"} 1\n')
        with pytest.raises(IngestError, match="invalid label name 'k8s.pod'"):
            TextImporter().to_batch(b'x{"k8s.pod"="a"} 1\n')
        TextImporter().to_batch(b'{"quoted_but_legacy_ok"} 1\n')
    finally:
        set_name_validation_scheme("utf8")
