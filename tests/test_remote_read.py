"""POST /api/v1/read (remote read): SAMPLES and STREAMED_XOR_CHUNKS, against real Prometheus 2.42s.

- As a client: a Prometheus with ``remote_read`` (``read_recent: true``) to TurboProm and no local
  data answers /api/v1/query and /api/v1/query_range over TurboProm's data (counters with resets,
  gauges with special values, a classic histogram, stale markers) exactly as TurboProm does. (2.42's
  client asks for SAMPLES only; STREAMED_XOR_CHUNKS is covered by the direct tests below.)
- As a server: a Prometheus holding the same samples (remote-written to it) answers the same
  ReadRequest; both response types decode to the same samples, bit for bit, and XOR chunks encoded
  by storage/xor_chunk.py from the samples of each of Prometheus's own chunks are byte-identical to
  Prometheus's.
- Limits, bad requests, tenancy and auth, directly.
"""
from __future__ import annotations

import json
import struct
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import cramjam
import google_crc32c
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from ingest.proto.messages import ChunkedReadResponse, ReadRequest, ReadResponse
from ingest.snappy_block import compress
from storage.stale import STALE_NAN_BITS
from storage.xor_chunk import MAX_SAMPLES, chunk_bounds, encode_chunks
from tests.helpers import ServerProcess
from tests.test_federation import _basic, _start_prometheus, _stop, auth_server, remote_write, write_tenants

STALE = float(np.array([STALE_NAN_BITS], np.uint64).view(np.float64)[0])
ODD_NAN = float(np.array([0x7FF8000000000123], np.uint64).view(np.float64)[0])
EQ, NEQ, RE, NRE = 0, 1, 2, 3


# ------------------------------------------------------------------ reference decoders (test side)
def decode_xor(data: bytes) -> list[tuple[int, int]]:
    """(timestamp, value bits) of an XOR chunk, read one sample at a time as Go's xorIterator does."""
    n = int.from_bytes(data[:2], "big")
    total = (len(data) - 2) * 8
    bits = int.from_bytes(data[2:], "big") if total else 0
    pos = 0

    def read(k: int) -> int:
        nonlocal pos
        assert pos + k <= total, "chunk too short"
        v = (bits >> (total - pos - k)) & ((1 << k) - 1)
        pos += k
        return v

    def uvarint() -> int:
        x = s = 0
        while True:
            b = read(8)
            x |= (b & 0x7F) << s
            s += 7
            if b < 0x80:
                return x

    out: list[tuple[int, int]] = []
    t = tdelta = vbits = lead = trail = 0
    for i in range(n):
        if i == 0:
            ux = uvarint()
            t, vbits = (ux >> 1) ^ -(ux & 1), read(64)
            out.append((t, vbits))
            continue
        if i == 1:
            tdelta = uvarint()
        else:
            ctrl = 0
            for _ in range(4):
                b = read(1)
                ctrl = (ctrl << 1) | b
                if not b:
                    break
            sz = {0b0: 0, 0b10: 14, 0b110: 17, 0b1110: 20, 0b1111: 64}[ctrl]
            dod = read(sz) if sz else 0
            if sz == 64 and dod >= 1 << 63:
                dod -= 1 << 64
            elif sz and sz != 64 and dod > 1 << (sz - 1):
                dod -= 1 << sz
            tdelta += dod
        t += tdelta
        if read(1):
            if read(1):
                lead, sig = read(5), read(6) or 64
                trail = 64 - lead - sig
            vbits ^= read(64 - lead - trail) << trail
        out.append((t, vbits))
    assert total - pos < 16, "trailing bits beyond padding"
    return out


def read_frames(body: bytes) -> list:
    """ChunkedReadResponse messages of a streamed body, each frame's CRC-32C checked."""
    out, p = [], 0
    while p < len(body):
        n = s = 0
        while True:
            b = body[p]
            p += 1
            n |= (b & 0x7F) << s
            s += 7
            if b < 0x80:
                break
        crc = struct.unpack(">I", body[p:p + 4])[0]
        msg = body[p + 4:p + 4 + n]
        p += 4 + n
        assert len(msg) == n and crc == google_crc32c.value(msg), "bad frame"
        out.append(ChunkedReadResponse.FromString(msg))
    return out


# ------------------------------------------------------------------ client helpers
def read_request(queries: list[tuple[int, int, list[tuple[int, str, str]]]], streamed: bool = False) -> bytes:
    req = ReadRequest()
    for start, end, ms in queries:
        q = req.queries.add(start_timestamp_ms=start, end_timestamp_ms=end)
        for typ, name, value in ms:
            q.matchers.add(type=typ, name=name, value=value)
    if streamed:
        req.accepted_response_types.extend([1, 0])
    return compress(req.SerializeToString())


def post_read(url: str, body: bytes, headers: dict | None = None) -> tuple[int, bytes, dict]:
    h = {"Content-Type": "application/x-protobuf", "Content-Encoding": "snappy", "X-Prometheus-Remote-Read-Version": "0.1.0",
         **(headers or {})}
    req = urllib.request.Request(url + "/api/v1/read", data=body, headers=h, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.read(), dict(r.headers)
    except urllib.error.HTTPError as e:
        return e.code, e.read(), dict(e.headers)


Series = dict[tuple, list[tuple[int, int]]]  # labels -> [(t, value bits)]


def samples_of(body: bytes) -> list[Series]:
    resp = ReadResponse.FromString(bytes(cramjam.snappy.decompress_raw(body)))
    out = []
    for qr in resp.results:
        d: Series = {}
        for ts in qr.timeseries:
            bits = np.array([s.value for s in ts.samples], np.float64).view(np.uint64).tolist()
            d[tuple((lb.name, lb.value) for lb in ts.labels)] = list(zip([s.timestamp for s in ts.samples], bits))
        out.append(d)
    return out


def streamed_of(body: bytes, nqueries: int, ranges: list[tuple[int, int]] | None = None) -> list[Series]:
    """Samples of a streamed response per query (trimmed to the query's range when given: Prometheus
    sends whole chunks)."""
    out: list[Series] = [{} for _ in range(nqueries)]
    for m in read_frames(body):
        for cs in m.chunked_series:
            key = tuple((lb.name, lb.value) for lb in cs.labels)
            got = out[m.query_index].setdefault(key, [])
            for ch in cs.chunks:
                assert ch.type == 1  # XOR
                smp = decode_xor(ch.data)
                assert smp and smp[0][0] == ch.min_time_ms and smp[-1][0] == ch.max_time_ms
                got.extend(smp)
    if ranges:
        for d, (a, b) in zip(out, ranges):
            for k in list(d):
                d[k] = [(t, v) for t, v in d[k] if a <= t <= b]
                if not d[k]:
                    del d[k]
    return out


def assert_same(got: list[Series], want: list[Series]) -> None:
    """Equal per query, series and sample (value bits); a failure names the first difference."""
    assert len(got) == len(want), (len(got), len(want))
    for qi, (g, w) in enumerate(zip(got, want)):
        assert sorted(g) == sorted(w), (qi, sorted(set(g) ^ set(w))[:3])
        for key in w:
            if g[key] != w[key]:
                diff = next((i for i, (a, b) in enumerate(zip(g[key], w[key])) if a != b), min(len(g[key]), len(w[key])))
                pytest.fail(f"query {qi} series {key}: {len(g[key])} vs {len(w[key])} samples, first difference at "
                            f"{diff}: {g[key][diff:diff + 2]} vs {w[key][diff:diff + 2]}")


# ------------------------------------------------------------------ data
def rr_data(now_ms: int) -> list[tuple[dict, list[int], list[float]]]:
    """55 minutes of: counters with resets, gauges (random, special values, irregular timestamps with
    big gaps), a classic histogram, a series with stale markers in the middle and at the end."""
    rng = np.random.default_rng(7)
    start = now_ms - 55 * 60_000
    ts = [start + k * 15_000 for k in range(220)]
    out: list[tuple[dict, list[int], list[float]]] = []
    for code in ("200", "500"):
        acc, vals = 0.0, []
        for k in range(220):
            acc = float(k % 5) if k in (60, 150) else acc + float(rng.integers(0, 20)) + (0.25 if code == "500" else 0)
            vals.append(acc)
        out.append(({"__name__": "rr_requests_total", "job": "api", "instance": "a:1", "code": code}, ts, vals))
    jitter = np.cumsum(rng.choice([15_000, 15_001, 14_999, 1, 60_000, 7, 300_000 - 1], size=150))
    its = [int(start + j) for j in jitter if start + j < now_ms]
    specials = [1.5, -0.0, float("inf"), float("-inf"), ODD_NAN, float("nan"), 1e-300, 1.7976931348623157e308]
    out.append(({"__name__": "rr_gauge", "job": "api", "kind": "a"}, its, rng.standard_normal(len(its)).tolist()))
    out.append(({"__name__": "rr_gauge", "job": "api", "kind": "b"}, ts, [specials[k % len(specials)] if k % 9 == 0 else 100.0 + k
                                                                         for k in range(220)]))
    out.append(({"__name__": "rr_gauge", "job": "api", "kind": "c"}, ts, [42.0] * 220))
    for le, frac in (("0.1", 0.25), ("0.5", 0.6), ("1", 0.85), ("+Inf", 1.0)):
        out.append(({"__name__": "rr_latency_seconds_bucket", "job": "api", "le": le}, ts,
                    [float(int(frac * 10 * k)) for k in range(220)]))
    out.append(({"__name__": "rr_latency_seconds_count", "job": "api"}, ts, [float(10 * k) for k in range(220)]))
    out.append(({"__name__": "rr_latency_seconds_sum", "job": "api"}, ts, [1.5 * k for k in range(220)]))
    flappy = [STALE if k in (80, 81, 219) or 120 <= k < 140 else float(k) for k in range(220)]
    out.append(({"__name__": "rr_flappy", "job": "api"}, ts, flappy))
    return out


@pytest.fixture(scope="module")
def peers(tmp_path_factory):
    """TurboProm and a Prometheus (remote-write receiver) holding the same samples."""
    tmp: Path = tmp_path_factory.mktemp("rr")
    now = int(time.time() * 1000)
    data = rr_data(now)
    ours = ServerProcess(tmp / "data", ["--wal-fsync", "never"]).start()
    prom = None
    try:
        prom, base = _start_prometheus(tmp, "global: {scrape_interval: 1m}\n", ["--web.enable-remote-write-receiver"])
        remote_write(ours.url, data)
        remote_write(base, data)
        yield ours.url, base, now, data, tmp
    finally:
        if prom is not None:
            _stop(prom)
        ours.stop()


# ------------------------------------------------------------------ the encoder
@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 2**40), st.one_of(st.floats(allow_nan=True), st.sampled_from([0.0, 1.0, 2.0, STALE]))),
                min_size=1, max_size=400),
       st.integers(-2**50, 2**50), st.lists(st.integers(0, 400), max_size=4))
def test_xor_chunks_round_trip(steps, t0, cuts):
    ts = np.cumsum([t0] + [d for d, _ in steps[1:]]).astype(np.int64)
    vs = np.array([v for _, v in steps], np.float64)
    offsets = np.unique(np.clip([0, len(ts), *cuts], 0, len(ts))).astype(np.int64)
    bounds = chunk_bounds(offsets)
    assert np.all(np.diff(bounds) <= MAX_SAMPLES) and np.all(np.diff(bounds) > 0)
    assert set(offsets.tolist()) <= set(bounds.tolist())
    data, offs = encode_chunks(ts, vs, bounds)
    for c in range(len(bounds) - 1):
        a, b = bounds[c], bounds[c + 1]
        assert decode_xor(data[offs[c]:offs[c + 1]]) == list(zip(ts[a:b].tolist(), vs[a:b].view(np.uint64).tolist()))


@pytest.mark.peer
def test_xor_chunks_byte_identical_to_prometheus(peers):
    _, prom, now, _, _ = peers
    st_, body, hdrs = post_read(prom, read_request([(0, now + 1, [(RE, "__name__", "rr_.+")])], streamed=True))
    assert st_ == 200, body[:300]
    n, series = 0, 0
    for m in read_frames(body):
        for cs in m.chunked_series:
            series += 1
            for ch in cs.chunks:
                smp = decode_xor(ch.data)
                ts = np.array([t for t, _ in smp], np.int64)
                vs = np.array([v for _, v in smp], np.uint64).view(np.float64)
                mine, offs = encode_chunks(ts, vs, np.array([0, len(ts)]))
                assert mine == ch.data, (cs.labels, len(smp))
                n += 1
    # the comparison saw Prometheus's chunks: every series written, each in one or more chunks (how many
    # depends on where the wall clock puts Prometheus's chunk-range boundaries)
    assert series == len({tuple(sorted(lbl.items())) for lbl, _, _ in rr_data(now)}) and n >= series


# ------------------------------------------------------------------ direct client, both servers
def _queries(now: int) -> list[tuple[int, int, list[tuple[int, str, str]]]]:
    start = now - 55 * 60_000
    return [
        (0, now + 1, [(RE, "__name__", "rr_.+")]),
        (start + 600_000, start + 1_800_000, [(EQ, "__name__", "rr_requests_total"), (NEQ, "code", "500")]),
        (start, now, [(EQ, "__name__", "rr_gauge"), (NRE, "kind", "a|c")]),
        (start + 1_000_000, start + 1_000_000, [(EQ, "__name__", "rr_flappy")]),  # one instant, maybe no sample
        (start, now, [(EQ, "__name__", "rr_none")]),
        (start + 1_200_000, now, [(EQ, "job", "api"), (RE, "le", ".+")]),
    ]


@pytest.mark.peer
def test_samples_response_same_as_prometheus(peers):
    ours, prom, now, data, _ = peers
    body = read_request(_queries(now))
    (s1, b1, h1), (s2, b2, h2) = post_read(ours, body), post_read(prom, body)
    assert s1 == s2 == 200, (b1[:300], b2[:300])
    assert h1["Content-Type"] == "application/x-protobuf" and h1["Content-Encoding"] == "snappy"
    got, want = samples_of(b1), samples_of(b2)
    assert len(got) == 6
    # Prometheus also lists series of which it holds a chunk overlapping the range but no sample in it
    # (with no samples); TurboProm lists only series with samples in the range.
    want = [{k: v for k, v in d.items() if v} for d in want]
    # Prometheus's SAMPLES encoder (gogo protobuf) omits a value that compares equal to 0, so -0.0
    # arrives as +0.0 from it; ours keeps the sign bit (its streamed chunks keep it too, see below).
    assert_same([{k: [(t, 0 if v == 1 << 63 else v) for t, v in vs] for k, vs in d.items()} for d in got], want)
    # stale markers and the odd NaN payload kept their bits
    flappy = got[0][(("__name__", "rr_flappy"), ("job", "api"))]
    assert sum(v == STALE_NAN_BITS for _, v in flappy) == 23
    gauge_b = got[0][(("__name__", "rr_gauge"), ("job", "api"), ("kind", "b"))]
    assert any(v == 0x7FF8000000000123 for _, v in gauge_b) and any(v == 1 << 63 for _, v in gauge_b)  # -0.0
    assert got[4] == {} and sum(len(v) for d in got for v in d.values()) > 2000


@pytest.mark.peer
def test_streamed_response_same_samples_as_prometheus(peers):
    ours, prom, now, _, _ = peers
    qs = _queries(now)
    body = read_request(qs, streamed=True)
    (s1, b1, h1), (s2, b2, _) = post_read(ours, body), post_read(prom, body)
    assert s1 == s2 == 200, (b1[:300], b2[:300])
    assert h1["Content-Type"] == "application/x-streamed-protobuf; proto=prometheus.ChunkedReadResponse"
    assert "Content-Encoding" not in h1
    ranges = [(a, b) for a, b, _ in qs]
    got, want = streamed_of(b1, len(qs)), streamed_of(b2, len(qs), ranges)
    assert_same(got, want)
    assert_same(got, samples_of(post_read(ours, read_request(qs))[1]))
    frames = read_frames(b1)
    assert all(len(m.chunked_series) == 1 for m in frames)
    assert all(len(decode_xor(c.data)) <= MAX_SAMPLES for m in frames for c in m.chunked_series[0].chunks)
    idx = [m.query_index for m in frames]
    assert idx == sorted(idx) and set(idx) == {i for i, d in enumerate(got) if d}


# ------------------------------------------------------------------ Prometheus as the remote-read client
def _prom_get(base: str, path: str, params: dict, headers: dict | None = None) -> dict:
    req = urllib.request.Request(f"{base}{path}?" + urllib.parse.urlencode(params), headers=headers or {})
    with urllib.request.urlopen(req, timeout=60) as r:
        doc = json.loads(r.read())
    assert doc["status"] == "success", doc
    return doc["data"]


def _canon(data: dict) -> list:
    key = "values" if data["resultType"] == "matrix" else "value"
    if data["resultType"] not in ("matrix", "vector"):
        return [data["result"]]
    return sorted((tuple(sorted(r["metric"].items())), json.dumps(r[key])) for r in data["result"])


PEER_QUERIES = [
    '{__name__=~"rr_.+"}', "rr_requests_total", "rate(rr_requests_total[5m])", "increase(rr_requests_total[10m])",
    "resets(rr_requests_total[1h])", "sum by (code) (rate(rr_requests_total[2m]))", 'rr_gauge{kind=~"a|b"}',
    'rr_gauge{kind!~"a"}', "max_over_time(rr_gauge[5m])", "count_over_time(rr_gauge[10m])", "rr_flappy",
    "count_over_time(rr_flappy[3m])", "last_over_time(rr_flappy[2m])",
    "histogram_quantile(0.9, sum by (le) (rate(rr_latency_seconds_bucket[5m])))",
    "rate(rr_latency_seconds_sum[5m]) / rate(rr_latency_seconds_count[5m])", "timestamp(rr_flappy)",
]


@pytest.mark.peer
def test_prometheus_remote_read_answers_like_turboprom(peers):
    ours, _, now, _, tmp = peers
    client = tmp / "client"
    client.mkdir()
    prom, base = _start_prometheus(client, f"""
global: {{scrape_interval: 1m}}
remote_read:
  - url: {ours}/api/v1/read
    read_recent: true
""")
    try:
        start, end = (now - 55 * 60_000) / 1000, now / 1000
        # Evaluation times halfway between the 15 s samples: TurboProm's range windows are left-open
        # (Prometheus 3), 2.42's are closed, so a sample exactly at t - range would count in one only.
        checked = 0
        for q in PEER_QUERIES:
            for t in (start + 607.5, start + 1807.5, start + 2107.5, end - 22.5, end + 127.5):
                a = _prom_get(base, "/api/v1/query", {"query": q, "time": f"{t:.3f}"})
                b = _prom_get(ours, "/api/v1/query", {"query": q, "time": f"{t:.3f}"})
                assert _canon(a) == _canon(b), (q, t)
                checked += len(a["result"])
            params = {"query": q, "start": f"{start + 7.5:.3f}", "end": f"{end:.3f}", "step": "30"}
            a = _prom_get(base, "/api/v1/query_range", params)
            b = _prom_get(ours, "/api/v1/query_range", params)
            assert _canon(a) == _canon(b), q
            checked += len(a["result"])
        assert checked > 100
    finally:
        _stop(prom)


# ------------------------------------------------------------------ limits and bad requests
def test_limits_and_bad_requests(tmp_path):
    srv = ServerProcess(tmp_path / "data", ["--wal-fsync", "never", "--query.max-samples", "100"]).start()
    try:
        now = int(time.time() * 1000)
        remote_write(srv.url, [({"__name__": "lim", "job": "x"}, [now - 300_000 + k * 1000 for k in range(300)], [1.0] * 300)])
        for streamed in (False, True):
            st_, b, _ = post_read(srv.url, read_request([(0, now, [(EQ, "__name__", "lim")])], streamed))
            doc = json.loads(b)
            assert st_ == 400 and doc["errorType"] == "bad_data" and doc["error"] == "exceeded sample limit (100)", b
            # two queries of 60 samples each: the limit counts the whole request
            q = (now - 60_000 + 1, now, [(EQ, "__name__", "lim")])
            assert post_read(srv.url, read_request([q, q], streamed))[0] == 400
            assert post_read(srv.url, read_request([q], streamed))[0] == 200
        bad = [
            (b"", "empty remote read request body"),
            (b"not snappy at all", "snappy"),
            (compress(b"\xff\xff\xff"), "unable to decode the read request"),
            (read_request([(0, now, [(RE, "__name__", "(")])]), "error parsing regexp"),
            (read_request([(0, now, [(7, "__name__", "x")])]), "invalid matcher type 7"),
        ]
        unsupported = ReadRequest(accepted_response_types=[5])
        bad.append((compress(unsupported.SerializeToString()), "does not support any of the requested response types"))
        for body, want in bad:
            st_, b, _ = post_read(srv.url, body)
            doc = json.loads(b)
            assert st_ == 400 and doc["status"] == "error" and want in doc["error"], (body[:20], b)
        big = ReadRequest()
        big.queries.add().matchers.add(name="x", value="y" * (33 * 1024 * 1024))
        st_, b, _ = post_read(srv.url, compress(big.SerializeToString()))
        assert st_ == 413, b[:200]
        req = urllib.request.Request(srv.url + "/api/v1/read")
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req, timeout=10)
        assert e.value.code == 405
    finally:
        srv.stop()


# ------------------------------------------------------------------ tenancy and auth
@pytest.mark.peer
def test_tenant_reads_only_its_own_series(tmp_path):
    srv = auth_server(tmp_path)
    prom = None
    try:
        now = int(time.time() * 1000)
        write_tenants(srv.url, now)
        body = read_request([(0, now + 1, [(RE, "__name__", ".+")])])
        b_user = {"Authorization": _basic("reader_b"), "X-Scope-OrgID": "team-b"}
        for streamed in (False, True):
            body = read_request([(0, now + 1, [(RE, "__name__", ".+")]), (0, now + 1, [(RE, "__tenant__", ".+")])], streamed)
            st_, b, _ = post_read(srv.url, body, b_user)
            assert st_ == 200
            got = streamed_of(b, 2) if streamed else samples_of(b)
            assert list(got[0]) == [(("__name__", "teamb_metric"), ("instance", "teamb-inst"), ("job", "svc"),
                                     ("secret", "teamb-secret"))] and got[1] == {}
            assert b"dflt" not in b and b"teama" not in b
        for headers, code in (({"Authorization": _basic("reader_b")}, 403),
                              ({"Authorization": _basic("reader_b"), "X-Scope-OrgID": "team-a"}, 403),
                              ({"Authorization": _basic("writer")}, 403), ({}, 401)):
            st_, b, _ = post_read(srv.url, body, headers)
            assert st_ == code and b"dflt" not in b and b"teama" not in b, (headers, st_, b[:200])
        # A real Prometheus with the tenant-B credential. Debian's 2.42 does not send remote_read's
        # configured ``headers`` (checked: no X-Scope-OrgID arrives), so it acts as the default
        # tenant, which that user may not read: the remote read is refused, nothing leaks.
        prom, base = _start_prometheus(tmp_path, f"""
global: {{scrape_interval: 1m}}
remote_read:
  - url: {srv.url}/api/v1/read
    read_recent: true
    basic_auth: {{username: reader_b, password: reader-b-pw}}
    headers: {{X-Scope-OrgID: team-b}}
""")
        req = urllib.request.Request(f"{base}/api/v1/query?" + urllib.parse.urlencode(
            {"query": '{__name__=~".+"}', "time": f"{now / 1000:.3f}"}))
        doc = json.loads(urllib.request.urlopen(req, timeout=60).read())
        assert doc["data"]["result"] == [] and "403" in " ".join(doc.get("warnings", [])), doc
        assert "dflt" not in json.dumps(doc) and "teama" not in json.dumps(doc)
    finally:
        if prom is not None:
            _stop(prom)
        srv.stop()
