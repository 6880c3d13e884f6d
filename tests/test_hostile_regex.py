"""Hostile and tricky regular expressions against a real server.

* Regex bombs (``(a+)+$`` against 28+ characters, which takes Python's backtracking ``re`` seconds)
  in selectors, ``match[]`` of /api/v1/series|labels|label values, ``label_replace`` and scrape
  ``metric_relabel_configs``: every answer is prompt and correct, and a responsiveness monitor
  polling ``/-/healthy`` and ``/api/v1/congestion`` keeps p99 <= 100 ms while they run.
* Syntax Go's RE2 refuses (backreferences, look-around, ``\\C``, ``(?x)``): 400 ``bad_data`` with
  Go's ``error parsing regexp: ...`` text, on every surface that takes a regex.
* Semantics compared with a real Prometheus 2.42 fed the same samples (``(?i)`` mid-pattern,
  anchoring, Unicode and POSIX classes, named groups and ``$`` expansion in ``label_replace``,
  error texts), and with Prometheus 3's documented ``(?s)`` for what 2.42 did differently
  (``.`` matches a newline since Prometheus 3).
"""
from __future__ import annotations

import json
import re
import subprocess
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from ingest.proto.messages import WriteRequest
from ingest.snappy_block import compress
from tests.helpers import ServerProcess, free_port, http_json, require_binary, wait_http
from tests.hostile_monitor import ResponsivenessMonitor

BOMB = "(a+)+$"
A28 = "a" * 28
A30B = "a" * 30 + "b"
# a second classic: exponential for a backtracking engine on a long run of x's with no y
BOMB2 = "(x+x+)+y"
X40 = "x" * 40
PROMPT_S = 1.0  # a linear-time engine answers these in milliseconds; backtracking takes seconds to hours

VALUES = ["a", "b", "B", "ab", "Ab", "aB", "ba", "abc", "ÄBC", "äbc", "héllo", "h1", "Ωμέγα", "123", "١٢٣",
          "x\ny", "x.y", "", "a.b", "a|b", "under_score", "long-" + "z" * 40, A28, A30B, X40, "é"]


def _now_ms() -> int:
    return int(time.time() * 1000)


def _write_request(series: list[dict[str, str]], t_ms: int) -> bytes:
    w = WriteRequest()
    for i, labels in enumerate(series):
        ts = w.timeseries.add()
        for n, v in sorted(labels.items()):
            ts.labels.add(name=n, value=v)
        ts.samples.add(value=float(i), timestamp=t_ms)
    return compress(w.SerializeToString())


def _remote_write(base: str, payload: bytes) -> None:
    st, body, _ = http_json(base + "/api/v1/write", data=payload,
                            headers={"Content-Type": "application/x-protobuf", "Content-Encoding": "snappy",
                                     "X-Prometheus-Remote-Write-Version": "0.1.0"})
    assert st in (200, 204), (st, body)


def _series() -> list[dict[str, str]]:
    out = [{"__name__": "rx", "v": v, "k": str(i)} for i, v in enumerate(VALUES)]
    out.append({"__name__": "rx", "k": "nolabel"})  # a series without label v: reads as ""
    return out


def _get(base: str, path: str, params: list[tuple[str, str]] | dict) -> tuple[int, dict, float]:
    q = urllib.parse.urlencode(params)
    t0 = time.perf_counter()
    st, body, _ = http_json(f"{base}{path}?{q}", timeout=120)
    return st, body, time.perf_counter() - t0


def _metrics(body: dict) -> list[dict]:
    return sorted((r["metric"] for r in body["data"]["result"]), key=lambda m: json.dumps(m, sort_keys=True))


def _ks(body: dict) -> list[str]:
    return sorted(m.get("k", "") for m in _metrics(body))


def _k_of(pred) -> list[str]:
    return sorted(s.get("k", "") for s in _series() if pred(s.get("v", "")))


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    """Our server with the rx series plus 3000 bulk series with long values (so a regex runs over
    many distinct values), written at one instant; yields (base url, sample time in s)."""
    tmp = tmp_path_factory.mktemp("hostile-regex")
    srv = ServerProcess(tmp / "data").start()
    t = _now_ms() - 1000
    try:
        _remote_write(srv.url, _write_request(_series(), t))
        bulk = [{"__name__": "bulk", "v": "a" * (20 + i % 17) + ("b" if i % 2 else "") + str(i)} for i in range(3000)]
        _remote_write(srv.url, _write_request(bulk, t))
        yield srv.url, t / 1000
    finally:
        srv.stop()


def _instant(base: str, query: str, at: float) -> tuple[int, dict, float]:
    return _get(base, "/api/v1/query", {"query": query, "time": f"{at:.3f}"})


# --- regex bombs -----------------------------------------------------------------------------

def test_regex_bombs_are_prompt_and_correct(loaded):
    base, at = loaded
    cases = [
        (f'rx{{v=~"{BOMB}"}}', _k_of(lambda v: re.fullmatch(r"a+", v) is not None)),
        (f'rx{{v!~"{BOMB}"}}', _k_of(lambda v: re.fullmatch(r"a+", v) is None)),
        (f'rx{{v=~"{BOMB2}"}}', []),
        (f'rx{{v=~".*(a|aa)+c"}}', _k_of(lambda v: re.fullmatch(r".*(a)+c", v, re.S) is not None)),
    ]
    for q, want in cases:
        st, body, dt = _instant(base, q, at)
        assert st == 200, (q, body)
        assert _ks(body) == want, q
        assert dt < PROMPT_S, f"{q} took {dt:.2f}s"
    st, body, dt = _instant(base, f'count(bulk{{v=~"{BOMB}"}})', at)
    assert st == 200 and dt < PROMPT_S, (body, dt)
    assert body["data"]["result"] == []  # every bulk value ends in a digit
    st, body, dt = _instant(base, f'count(bulk{{v=~"(a+)+b?[0-9]+"}})', at)
    assert st == 200 and dt < PROMPT_S and body["data"]["result"][0]["value"][1] == "3000", (body, dt)


def test_regex_bombs_in_match_param_are_prompt_and_correct(loaded):
    base, at = loaded
    sel = f'rx{{v=~"{BOMB}"}}'
    want_vals = sorted({v for v in VALUES if re.fullmatch(r"a+", v)})
    window = {"start": f"{at - 60:.3f}", "end": f"{at + 60:.3f}"}
    st, body, dt = _get(base, "/api/v1/series", [("match[]", sel), *window.items()])
    assert st == 200 and dt < PROMPT_S, (body, dt)
    assert sorted(s["v"] for s in body["data"]) == want_vals
    st, body, dt = _get(base, "/api/v1/label/v/values", [("match[]", sel), *window.items()])
    assert st == 200 and dt < PROMPT_S and body["data"] == want_vals, (body, dt)
    st, body, dt = _get(base, "/api/v1/labels", [("match[]", f'{{__name__=~"rx|bulk", v=~"{BOMB2}|{BOMB}"}}'),
                                                  *window.items()])
    assert st == 200 and dt < PROMPT_S and body["data"] == ["__name__", "k", "v"], (body, dt)


def test_regex_bomb_in_label_replace_is_prompt_and_correct(loaded):
    base, at = loaded
    q = f'label_replace(rx{{k=~"{VALUES.index(A28)}|{VALUES.index(A30B)}"}}, "got", "[$1]", "v", "{BOMB}")'
    st, body, dt = _instant(base, q, at)
    assert st == 200 and dt < PROMPT_S, (body, dt)
    got = {m["v"]: m.get("got") for m in _metrics(body)}
    assert got == {A28: "[" + A28 + "]", A30B: None}  # Go: the last iteration of (a+)+ captures everything
    st, body, dt = _instant(base, f'count(label_replace(bulk, "got", "$1", "v", "{BOMB}"))', at)
    assert st == 200 and dt < PROMPT_S and body["data"]["result"][0]["value"][1] == "3000", (body, dt)


def test_server_stays_responsive_while_regex_bombs_run(loaded):
    """A client sends regex-bomb requests over 3000 distinct long values back to back for a few
    seconds (each would run for seconds to hours with a backtracking engine); the monitor's polls of
    /-/healthy and /api/v1/congestion keep p99 <= 100 ms throughout."""
    base, at = loaded
    window = {"start": f"{at - 60:.3f}", "end": f"{at + 60:.3f}"}
    requests = [
        ("/api/v1/query", {"query": f'count(bulk{{v=~"{BOMB}"}})', "time": f"{at:.3f}"}),
        ("/api/v1/query", {"query": f'count(bulk{{v!~"(a|aa)+b?[0-9]*{BOMB2}"}})', "time": f"{at:.3f}"}),
        ("/api/v1/query", {"query": f'count(label_replace(bulk, "x", "$1", "v", "(a+)+(b?)[0-9]+"))', "time": f"{at:.3f}"}),
        ("/api/v1/series", [("match[]", f'bulk{{v=~"(a*)*[0-9]{{3}}"}}'), *window.items()]),
        ("/api/v1/label/v/values", [("match[]", f'{{__name__="bulk", v=~"((a+)+)+b[0-9]+"}}'), *window.items()]),
    ]
    slow: list[tuple[str, float, int]] = []
    stop = time.monotonic() + 4.0

    def client(offset: int) -> None:
        i = offset
        while time.monotonic() < stop:
            path, params = requests[i % len(requests)]
            st, _, dt = _get(base, path, params)
            if st != 200 or dt > 5 * PROMPT_S:
                slow.append((path, dt, st))
            i += 1

    with ResponsivenessMonitor(base) as mon:
        th = threading.Thread(target=client, args=(0,))
        th.start()
        th.join(120)
    assert not slow, slow
    mon.assert_responsive(p99_limit_s=0.1, min_polls=20)


def _exporter(body: bytes) -> tuple[ThreadingHTTPServer, int]:
    class H(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    port = free_port()
    srv = ThreadingHTTPServer(("127.0.0.1", port), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, port


def test_regex_bomb_in_relabel_configs_is_prompt_and_correct(tmp_path):
    """metric_relabel_configs and relabel_configs with backtracking bombs: the scrape finishes in
    milliseconds with the right series kept and labels rewritten, and the server stays responsive."""
    lines = [f'scraped{{v="{A28}",w="keep"}} 1', f'scraped{{v="{A30B}",w="keep"}} 2', f'scraped{{v="{X40}",w="keep"}} 3']
    lines += [f'scraped_bulk{{v="{"a" * (25 + i % 9)}{i}"}} {i}' for i in range(2000)]
    exporter, port = _exporter(("\n".join(lines) + "\n").encode())
    cfg = {"global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
           "scrape_configs": [{
               "job_name": "bomb", "static_configs": [{"targets": [f"127.0.0.1:{port}"], "labels": {"tv": A30B}}],
               "relabel_configs": [{"source_labels": ["tv"], "regex": BOMB, "action": "drop"},
                                   {"source_labels": ["tv"], "regex": "(a+)+(b)", "target_label": "tb",
                                    "replacement": "${2}"}],
               "metric_relabel_configs": [
                   {"source_labels": ["v"], "regex": BOMB, "target_label": "all_a", "replacement": "yes"},
                   {"source_labels": ["v"], "regex": BOMB2, "action": "drop"},
                   {"source_labels": ["__name__", "v"], "regex": "scraped_bulk;(a+)+[0-9]*[13579]", "action": "drop"},
               ]}]}
    cfg_path = tmp_path / "config.yml"
    cfg_path.write_text(yaml.safe_dump(cfg))
    srv = ServerProcess(tmp_path / "data", ["--config", str(cfg_path)]).start()
    try:
        with ResponsivenessMonitor(srv.url) as mon:
            deadline = time.monotonic() + 30
            body: dict = {}
            while time.monotonic() < deadline:
                st, body, _ = _get(srv.url, "/api/v1/query", {"query": 'scrape_duration_seconds{job="bomb"}'})
                if st == 200 and body["data"]["result"]:
                    break
                time.sleep(0.2)
            time.sleep(2.5)  # a few more scrapes while the monitor polls
        assert body["data"]["result"], "the target was never scraped"
        st, dur, _ = _get(srv.url, "/api/v1/query", {"query": 'max_over_time(scrape_duration_seconds{job="bomb"}[1m])'})
        assert float(dur["data"]["result"][0]["value"][1]) < PROMPT_S
        st, got, _ = _get(srv.url, "/api/v1/query", {"query": "scraped"})
        assert st == 200
        by_v = {m["v"]: m for m in _metrics(got)}
        assert set(by_v) == {A28, A30B, X40}  # BOMB2 needs a "y": nothing dropped
        assert by_v[A28].get("all_a") == "yes" and "all_a" not in by_v[A30B]
        assert by_v[A28]["tb"] == "b" and by_v[A28]["tv"] == A30B  # target kept: tv ends in b
        st, cnt, _ = _get(srv.url, "/api/v1/query", {"query": "count(scraped_bulk)"})
        assert cnt["data"]["result"][0]["value"][1] == str(sum(1 for i in range(2000) if i % 2 == 0))
        mon.assert_responsive(p99_limit_s=0.1, min_polls=20)
    finally:
        srv.stop()
        exporter.shutdown()


# --- syntax RE2 refuses --------------------------------------------------------------------------

REFUSED = [
    ("(a)\\\\1", "invalid escape sequence: `\\1`"),
    ("(?=a)b", "invalid or unsupported Perl syntax: `(?=`"),
    ("(?!a)b", "invalid or unsupported Perl syntax: `(?!`"),
    ("a(?<=a)", "invalid or unsupported Perl syntax: `(?<=`"),
    ("(?x)a b", "invalid or unsupported Perl syntax: `(?x`"),
    ("a\\\\C", "invalid escape sequence: `\\C`"),
]


@pytest.mark.parametrize("pattern,detail", REFUSED)
def test_refused_syntax_is_bad_data_with_go_message(loaded, pattern, detail):
    base, at = loaded
    want = "error parsing regexp: " + detail
    window = [("start", f"{at - 60:.3f}"), ("end", f"{at + 60:.3f}")]
    surfaces = [
        ("/api/v1/query", {"query": f'rx{{v=~"{pattern}"}}', "time": f"{at:.3f}"}),
        ("/api/v1/query", {"query": f'sum(rate(rx{{k="1", v!~"{pattern}"}}[5m]))', "time": f"{at:.3f}"}),
        ("/api/v1/query_range", {"query": f'rx{{v=~"{pattern}"}}', "start": f"{at - 60:.3f}", "end": f"{at:.3f}", "step": "15"}),
        ("/api/v1/query", {"query": f'info(rx, {{v=~"{pattern}"}})', "time": f"{at:.3f}"}),
        ("/api/v1/series", [("match[]", f'rx{{v=~"{pattern}"}}'), *window]),
        ("/api/v1/labels", [("match[]", f'rx{{v=~"{pattern}"}}'), *window]),
        ("/api/v1/label/v/values", [("match[]", f'{{__name__="rx", v!~"{pattern}"}}'), *window]),
    ]
    for path, params in surfaces:
        st, body, dt = _get(base, path, params)
        assert st == 400, (path, params, st, body)
        assert body["errorType"] == "bad_data", (path, body)
        assert want in body["error"], (path, body["error"])
        assert dt < PROMPT_S
    # label_replace's regex is a runtime string argument: 422 execution, as in Prometheus, with Go's reason
    q = f'label_replace(rx, "out", "$1", "v", "{pattern}")'
    st, body, _ = _instant(base, q, at)
    assert st == 422 and body["errorType"] == "execution", body
    assert body["error"].startswith("invalid regular expression in label_replace(): ") and body["error"].endswith(want), body


def test_match_param_and_query_accept_the_same_regexes(loaded):
    """One conversion for /api/v1/series and /api/v1/query: a mid-pattern (?i) is Go syntax both take."""
    base, at = loaded
    sel = 'rx{v=~"a|(?i)b"}'
    st, q, _ = _instant(base, sel, at)
    assert st == 200, q
    st, s, _ = _get(base, "/api/v1/series", [("match[]", sel), ("start", f"{at - 60:.3f}"), ("end", f"{at + 60:.3f}")])
    assert st == 200, s
    want = _k_of(lambda v: v in ("a", "b", "B"))
    assert _ks(q) == want
    assert sorted(x["k"] for x in s["data"]) == want


def test_dot_matches_newline_and_patterns_are_anchored(loaded):
    """Prometheus 3 semantics: ^(?s:pattern)$ (2.42 had no (?s), so this one is not compared with the
    peer), with Go's classes and escapes: \\d and \\w are ASCII, \\z ends the text."""
    base, at = loaded
    for sel, pred in [
        ('rx{v=~"x.y"}', lambda v: v in ("x\ny", "x.y")),
        ('rx{v=~"x.y\\\\z"}', lambda v: v in ("x\ny", "x.y")),
        ('rx{v=~"\\\\d+"}', lambda v: v == "123"),
        ('rx{v=~"\\\\w+"}', lambda v: v != "" and all(c.isascii() and (c.isalnum() or c == "_") for c in v)),
        ('rx{v=~"x\\\\.y"}', lambda v: v == "x.y"),
        ('rx{v=~"(?-s)x.y"}', lambda v: v == "x.y"),
        ('rx{v=~"b"}', lambda v: v == "b"),
        ('rx{v!~".*b.*", k!="nolabel"}', lambda v: "b" not in v),
    ]:
        st, body, _ = _instant(base, sel, at)
        assert st == 200, (sel, body)
        want = [k for k in _k_of(pred) if not (sel.endswith('k!="nolabel"}') and k == "nolabel")]
        assert _ks(body) == want, sel
    st, body, _ = _instant(base, f'label_replace(rx{{k="{VALUES.index("x" + chr(10) + "y")}"}}, "out", "<$1|$2>", "v", "(.)(.*)")', at)
    assert _metrics(body)[0]["out"] == "<x|\ny>"


# --- the same answers as a real Prometheus -------------------------------------------------------

PEER_QUERIES = [
    'rx{v=~"a|(?i)b"}',
    'rx{v=~"(?i)äbc"}',
    'rx{v=~"a(?i)b"}',
    'rx{v=~"\\\\pL+"}',
    'rx{v=~"\\\\p{Greek}+"}',
    'rx{v=~"[[:alpha:]]+"}',
    'rx{v=~"[[:^alpha:]]+"}',
    'rx{v=~"\\\\d+"}',
    'rx{v=~"\\\\w+"}',
    'rx{v=~"\\\\PL+"}',
    'rx{v=~"b"}',
    'rx{v=~"a.*"}',
    'rx{v!~".*b"}',
    'rx{v=~"a|"}',
    'rx{v=~"a|b|ab"}',
    'rx{v=~"a\\\\|b"}',
    'rx{v=~"(?U)a+b?"}',
    'rx{v=~"é"}',
    'rx{v=~"..."}',
    f'rx{{v=~"{BOMB}"}}',
    'label_replace(rx, "out", "${1}-$2-$$-${name}-$9-$1x", "v", "(?P<name>[a-z])(b)?.*")',
    'label_replace(rx, "out", "$name", "v", "(?P<name>\\\\pL)\\\\pL*")',
    'label_replace(rx{k=~"1|2"}, "v", "", "v", ".*")',
]


@pytest.mark.peer
def test_regex_semantics_equal_prometheus(tmp_path):
    binary = require_binary("prometheus")
    ours = ServerProcess(tmp_path / "ours", ["--config", str(_empty_config(tmp_path))]).start()
    port = free_port()
    log = open(tmp_path / "prometheus.log", "ab")
    prom = subprocess.Popen([binary, f"--config.file={_empty_config(tmp_path)}", f"--storage.tsdb.path={tmp_path / 'prom'}",
                             f"--web.listen-address=127.0.0.1:{port}", "--web.enable-remote-write-receiver"],
                            stdout=log, stderr=subprocess.STDOUT)
    theirs = f"http://127.0.0.1:{port}"
    try:
        wait_http(theirs + "/-/ready", timeout=30, proc=prom)
        series = [s for s in _series() if "\n" not in s.get("v", "")]  # 2.42 has no (?s): keep newlines out
        t = _now_ms() - 1000
        payload = _write_request(series, t)
        _remote_write(ours.url, payload)
        _remote_write(theirs, payload)
        at = f"{t / 1000:.3f}"
        answered = 0
        for q in PEER_QUERIES:
            a = _get(ours.url, "/api/v1/query", {"query": q, "time": at})
            b = _get(theirs, "/api/v1/query", {"query": q, "time": at})
            assert a[0] == b[0] == 200, (q, a[1], b[1])
            assert _metrics(a[1]) == _metrics(b[1]), q
            answered += bool(b[1]["data"]["result"])
        assert answered == len(PEER_QUERIES)  # every comparison is over a non-empty answer
        window = [("start", f"{t / 1000 - 60:.3f}"), ("end", f"{t / 1000 + 60:.3f}")]
        for sel in ['rx{v=~"a|(?i)b"}', 'rx{v=~"[[:alpha:]]+", v!~"(?i)A.*"}', 'rx{v=~"\\\\pL+"}']:
            a = _get(ours.url, "/api/v1/series", [("match[]", sel), *window])
            b = _get(theirs, "/api/v1/series", [("match[]", sel), *window])
            assert a[0] == b[0] == 200 and _sorted(a[1]["data"]) == _sorted(b[1]["data"]), sel
            a = _get(ours.url, "/api/v1/label/v/values", [("match[]", sel), *window])
            b = _get(theirs, "/api/v1/label/v/values", [("match[]", sel), *window])
            assert a[0] == b[0] == 200 and a[1]["data"] == b[1]["data"], sel
        # refused syntax: same status, error type and Go error text (positions aside). Look-behind is
        # left out: Go's text for it changed with named-group syntax (Go 1.22: "invalid named capture").
        for pattern, _ in REFUSED:
            if "(?<" in pattern:
                continue
            q = f'rx{{v=~"{pattern}"}}'
            a = _get(ours.url, "/api/v1/query", {"query": q, "time": at})
            b = _get(theirs, "/api/v1/query", {"query": q, "time": at})
            assert a[0] == b[0] == 400 and a[1]["errorType"] == b[1]["errorType"] == "bad_data", (q, a[1], b[1])
            assert _regexp_error(a[1]["error"]) == _regexp_error(b[1]["error"]), (q, a[1], b[1])
        # label_replace's regex is a runtime argument: Prometheus answers 422 execution with its own
        # text, which ours extends with Go's reason
        q = 'label_replace(rx, "out", "$1", "v", "(?=x)")'
        a = _get(ours.url, "/api/v1/query", {"query": q, "time": at})
        b = _get(theirs, "/api/v1/query", {"query": q, "time": at})
        assert a[0] == b[0] == 422 and a[1]["errorType"] == b[1]["errorType"] == "execution", (a[1], b[1])
        assert a[1]["error"] == b[1]["error"] + ": error parsing regexp: invalid or unsupported Perl syntax: `(?=`", (a[1], b[1])
    finally:
        ours.stop()
        if prom.poll() is None:
            prom.terminate()
            prom.wait(30)
        log.close()


def _empty_config(tmp_path: Path) -> Path:
    p = tmp_path / "empty.yml"
    if not p.exists():
        p.write_text(yaml.safe_dump({"global": {"scrape_interval": "1h"}, "scrape_configs": []}))
    return p


def _sorted(items: list[dict]) -> list[str]:
    return sorted(json.dumps(x, sort_keys=True) for x in items)


def _regexp_error(msg: str) -> str:
    i = msg.find("error parsing regexp: ")
    assert i >= 0, msg
    return msg[i:]
