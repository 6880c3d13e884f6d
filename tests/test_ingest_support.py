"""Helpers for the ingest/scrape tests (no tests here): HTTP posting, protobuf payloads, reading
what the server stored by opening its data directory with the real TSDB after the server stopped."""
from __future__ import annotations

import http.client
import json
import time
from pathlib import Path

import numpy as np

from ingest.proto.messages import V2Request, WriteRequest
from ingest.snappy_block import compress
from storage.labels import Labels
from storage.matchers import Matcher

V2_CT = "application/x-protobuf;proto=io.prometheus.write.v2.Request"


def post(url: str, path: str, body: bytes, headers: dict | None = None, timeout: float = 30.0) -> tuple[int, dict, bytes]:
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        conn.request("POST", path, body=body, headers=headers or {})
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        conn.close()


def remote_write(url: str, payload: bytes, *, v2: bool = False, compressed: bool = True) -> tuple[int, dict, bytes]:
    headers = {"Content-Type": V2_CT if v2 else "application/x-protobuf", "Content-Encoding": "snappy",
               "X-Prometheus-Remote-Write-Version": "2.0.0" if v2 else "0.1.0"}
    return post(url, "/api/v1/write", compress(payload) if compressed else payload, headers)


def v1_payload(series: list[tuple[dict[str, str], list[tuple[int, float]]]], metadata: list[tuple[str, int, str, str]] = ()) -> bytes:
    w = WriteRequest()
    for labels, samples in series:
        ts = w.timeseries.add()
        for n, v in sorted(labels.items()):
            ts.labels.add(name=n, value=v)
        for t, v in samples:
            ts.samples.add(value=v, timestamp=t)
    for fam, typ, help_, unit in metadata:
        w.metadata.add(metric_family_name=fam, type=typ, help=help_, unit=unit)
    return w.SerializeToString()


def v2_payload(series: list[tuple[dict[str, str], list[tuple[int, float]]]], meta: dict[str, tuple[int, str, str]] | None = None) -> bytes:
    req = V2Request()
    symbols = [""]
    index = {"": 0}

    def ref(s: str) -> int:
        if s not in index:
            index[s] = len(symbols)
            symbols.append(s)
        return index[s]

    for labels, samples in series:
        ts = req.timeseries.add()
        for n, v in sorted(labels.items()):
            ts.labels_refs.extend([ref(n), ref(v)])
        for t, v in samples:
            ts.samples.add(value=v, timestamp=t)
        m = (meta or {}).get(labels.get("__name__", ""))
        if m:
            ts.metadata.type = m[0]
            ts.metadata.help_ref = ref(m[1])
            ts.metadata.unit_ref = ref(m[2])
    req.symbols.extend(symbols)
    return req.SerializeToString()


def error_of(body: bytes) -> str:
    doc = json.loads(body)
    assert doc["status"] == "error" and doc["errorType"], doc
    return doc["error"]


def read_stored(data_dir: Path, matchers: list[Matcher], mint: int = 0, maxt: int = 2**62) -> dict[Labels, tuple[np.ndarray, np.ndarray]]:
    """Open the stopped server's data dir with the real TSDB and return {labels: (timestamps, values)}."""
    from storage.tsdb import TSDB

    db = TSDB(str(data_dir), background=False)
    try:
        ss = db.select(matchers, mint, maxt)
        return {ss.labels[i]: tuple(np.copy(a) for a in ss.series(i)) for i in range(len(ss))}
    finally:
        db.close()


def name_is(name: str) -> list[Matcher]:
    return [Matcher("__name__", "=", name)]


def now_ms() -> int:
    return int(time.time() * 1000)


def metric_value(url: str, name: str, **labels: str) -> float:
    """Sum of a self-metric's samples on /metrics matching the given labels."""
    import urllib.request

    text = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name):
            continue
        head, _, val = line.rpartition(" ")
        if head.split("{")[0] != name:
            continue
        if all(f'{k}="{v}"' in head for k, v in labels.items()):
            total += float(val)
    return total
