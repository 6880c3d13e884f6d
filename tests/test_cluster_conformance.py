"""Answers through the cluster equal a single node's, on the real query corpora.

One LocalCluster (3 NATS JetStream nodes with an R=3 stream, etcd, 2 distributors, 3 ingesters
with RF=2, 1 querier; each its own process on loopback) and one single-node ``turboprom serve``
get the same data as remote-write bodies (real protocol bytes). After every ingester applied its
partitions' whole log, each query goes to the querier and to the single node over HTTP, and the
two answers must agree: same status and error type, same result type, same series (label sets),
same timestamps, values equal within the compliance tester's tolerance (relative 1e-5, NaN ==
NaN), same warnings/infos.

- The PromQL compliance tester's 539 expanded queries (bench/compliance.py: its data generation,
  query expansion and comparison, imported, not copied) as range queries over the demo data, with
  default settings and with ``exact=true``; then metric metadata, ``/api/v1/status/tsdb`` and
  remote read (bit for bit) over the same data; and the 539 queries again with one ingester
  SIGKILLed (its partitions then come from their other owner).
- The PromQL conformance corpus (../shared/promqltest/): every eval of a set of files as the
  corpus runner runs it (instant evals also with ``@`` pinned and in range mode), each data state
  (the loads since a ``clear`` up to an eval) under its own tenant (``X-Scope-OrgID``), so one
  cluster serves them all; ``fail`` evals must fail alike. Also each tenant's series, label names
  and metric names.
- ``/federate`` byte for byte, over recent samples with TYPE lines.

The querier pushes mergeable aggregations down to the ingesters (its default, docs/cluster.md
"Aggregation pushdown"); each comparison also checks from the querier's counters that many of its
aggregations were answered that way.

There is no known-difference list: every compared answer must agree.

Both sides run with the same storage flags: an out-of-order window and retention wide enough
for samples from 1970 (the corpus) and 2023 (the compliance data) next to each other.
"""
from __future__ import annotations

import json
import re
import time
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import pytest

from ingest.proto.messages import WriteRequest
from ingest.snappy_block import compress
from promql.promqltest_classify import NH, LoadedState, classify
from promql.promqltest import _QUERY_CONTEXT_FUNCS, at_modifier_cases
from promql.promqltest_script import ClearCmd, EvalCmd, Hist, LoadCmd, parse_script
from tests.helpers import SHARED, ServerProcess, load_bench, require_binary
from tests.test_api_helpers import http
from tests.test_cluster import post
from tests.test_remote_read import post_read, read_request, samples_of, streamed_of
from turboprom.cluster.local_cluster import LocalCluster

pytestmark = pytest.mark.peer

# the same on both sides: the corpus' samples start at t=0, the compliance data in 2023
STORAGE_FLAGS = ["--out-of-order-window", "100000d", "--retention-time", "100000d", "--wal-fsync", "never"]
INGESTERS = [f"ingester-{i}" for i in range(3)]
SLICE_MS = 300_000  # one remote-write body per 5 minutes of the compliance data (all its series)
# the corpus files compared, every eval of each (those that need native-histogram samples aside:
# remote write 1.0 bodies here carry floats, and the storage is float-only)
PROMQLTEST_FILES = ["aggregators", "functions", "operators", "histograms", "selectors", "range_queries",
                    "literals", "collision", "name_label_dropping", "trig_functions", "limit"]
BODY_SAMPLES = 20_000
_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="([^"]*)"')


def compliance():
    return load_bench("compliance")


# ------------------------------------------------------------------------------------------ data


def write_request(series: dict[tuple, list[tuple[int, float]]], metadata: list[tuple[str, int, str]] = ()) -> bytes:
    """A remote-write 1.0 body; ``metadata``: (metric family, MetricMetadata type number, help)."""
    w = WriteRequest()
    for family, typ, help_text in metadata:
        w.metadata.add(type=typ, metric_family_name=family, help=help_text)
    for labels, samples in series.items():
        ts = w.timeseries.add()
        for n, v in labels:
            ts.labels.add(name=n, value=v)
        for t, v in samples:
            ts.samples.add(value=v, timestamp=t)
    return compress(w.SerializeToString())


def compliance_bodies() -> tuple[list[bytes], int]:
    """The compliance data (bench/compliance.generate_text) as remote-write bodies in time order,
    each holding every series' samples of one slice."""
    slices: dict[int, dict[tuple, list[tuple[int, float]]]] = defaultdict(lambda: defaultdict(list))
    n = 0
    for line in compliance().generate_text().splitlines():
        head, value, ts = line.rsplit(" ", 2)
        name, _, rest = head.partition("{")
        labels = tuple(sorted([("__name__", name), *_LABEL.findall(rest)]))
        t = int(ts)
        slices[t // SLICE_MS][labels].append((t, float(value)))
        n += 1
    keys = sorted(slices)
    return [write_request(slices[k], compliance_metadata(slices[keys[0]]) if k == keys[0] else ()) for k in keys], n


def compliance_metadata(series: dict[tuple, list]) -> list[tuple[str, int, str]]:
    """TYPE/HELP of the compliance data's families, as a scraping Prometheus sends them."""
    names = sorted({dict(labels)["__name__"] for labels in series})
    out = []
    for name in names:
        family, typ = name, 2  # gauge
        if name.endswith("_total"):
            family, typ = name[: -len("_total")], 1  # counter
        for suffix in ("_bucket", "_sum", "_count"):
            if name.endswith(suffix) and name.startswith("demo_api_request_duration_seconds"):
                family, typ = name[: -len(suffix)], 3  # histogram
        out.append((family, typ, f"{family.replace('_', ' ')}."))
    return sorted(set(out))


@dataclass
class Epoch:
    """A state of a corpus file's data: the loads since the last ``clear`` up to some eval, kept
    under its own tenant, and the evals that run against that state."""
    tenant: str
    loads: list[LoadCmd]
    evals: list[tuple[EvalCmd, Any]] = field(default_factory=list)  # with the parsed query (None: unparseable)


@dataclass
class Corpus:
    epochs: list[Epoch] = field(default_factory=list)
    skipped_native: int = 0


def corpus_epochs(files: list[str]) -> Corpus:
    """Every eval of ``files`` with the data it runs against. A load after an eval starts a new
    state (tenant) holding every load of the section so far, as the runner's storage would."""
    out = Corpus()
    for stem in files:
        loads: list[LoadCmd] = []
        state = LoadedState()
        current: Epoch | None = None
        for cmd in parse_script((SHARED / "promqltest" / f"{stem}.test").read_text()):
            if isinstance(cmd, ClearCmd):
                loads, state, current = [], LoadedState(), None
            elif isinstance(cmd, LoadCmd):
                loads = [*loads, cmd]
                state.add_load(cmd)
                current = None
            elif isinstance(cmd, EvalCmd):
                cl = classify(cmd, state)
                if cl.kind == NH:
                    out.skipped_native += 1
                    continue
                if current is None:
                    current = Epoch(f"pqt-{stem}-{len(out.epochs)}".replace("_", "-"), loads)
                    out.epochs.append(current)
                current.evals.append((cmd, cl.ast))
    return out


def load_bodies(loads: list[LoadCmd]) -> list[bytes]:
    """The float samples of ``loads`` (stale markers bit-exact) as remote-write bodies."""
    bodies: list[bytes] = []
    series: dict[tuple, list[tuple[int, float]]] = defaultdict(list)
    n = 0
    for cmd in loads:
        for labels, vals in cmd.series.items():
            for i, v in enumerate(vals):
                if v is None or isinstance(v, Hist):
                    continue
                series[tuple(labels)].append((i * cmd.interval_ms, float(v)))
                n += 1
                if n >= BODY_SAMPLES:
                    bodies.append(write_request(series))
                    series, n = defaultdict(list), 0
        if series:  # a later load of the same series may go back in time: one body per load at least
            bodies.append(write_request(series))
            series, n = defaultdict(list), 0
    return bodies


def write_all(url: str, bodies: list[bytes], headers: dict | None = None) -> None:
    for b in bodies:
        code, _ = post(url + "/api/v1/write", b, headers)
        assert code == 204, code


# ------------------------------------------------------------------------------------ comparison


def answers_differ(a: tuple[int, bytes], b: tuple[int, bytes]) -> str:
    """'' when the single node's answer ``a`` and the querier's ``b`` agree, else what differs."""
    mod = compliance()
    if a[0] != b[0]:
        return f"HTTP {a[0]} vs {b[0]}: {a[1][:200]!r} / {b[1][:200]!r}"
    da, db = _json(a[1]), _json(b[1])
    if da is None or db is None:
        return "" if a[1] == b[1] else f"not JSON: {a[1][:200]!r} / {b[1][:200]!r}"
    if da.get("status") != db.get("status") or da.get("errorType") != db.get("errorType"):
        return f"{da.get('status')}/{da.get('errorType')} vs {db.get('status')}/{db.get('errorType')}: {da.get('error')} / {db.get('error')}"
    for k in ("warnings", "infos"):
        if sorted(_notes(da.get(k))) != sorted(_notes(db.get(k))):
            return f"{k}: {da.get(k)} vs {db.get(k)}"
    if da.get("status") != "success":
        return ""
    ra, rb = da["data"], db["data"]
    if ra["resultType"] != rb["resultType"]:
        return f"result type {ra['resultType']} vs {rb['resultType']}"
    typ = ra["resultType"]
    if typ in ("scalar", "string"):
        ok = ra["result"][0] == rb["result"][0] and (ra["result"][1] == rb["result"][1] if typ == "string"
                                                      else _same_value(ra["result"][1], rb["result"][1]))
        return "" if ok else f"{typ} {ra['result']} vs {rb['result']}"
    if typ == "vector":  # as a one-step matrix, so the tester's comparison applies
        ra = {"resultType": "matrix", "result": [{"metric": s["metric"], "values": [s["value"]]} for s in ra["result"] if "value" in s]}
        rb = {"resultType": "matrix", "result": [{"metric": s["metric"], "values": [s["value"]]} for s in rb["result"] if "value" in s]}
        if len(ra["result"]) != len(da["data"]["result"]) or len(rb["result"]) != len(db["data"]["result"]):
            return "" if _canon(da["data"]) == _canon(db["data"]) else "histogram samples differ"
    out = mod.compare(mod.Case("?"), (200, _doc(ra)), (200, _doc(rb)))
    return "" if out.status == "passed" else out.detail


def lists_differ(a: tuple[int, bytes], b: tuple[int, bytes]) -> str:
    """'' when two series/labels/label-values/metadata answers agree (same status, same items in any
    order; for metadata, the same entries of each metric in the same order)."""
    da, db = _json(a[1]), _json(b[1])
    if a[0] != b[0] or da is None or db is None or da.get("status") != db.get("status"):
        return f"HTTP {a[0]} vs {b[0]}: {a[1][:200]!r} / {b[1][:200]!r}"
    if isinstance(da.get("data"), dict) or isinstance(db.get("data"), dict):  # metadata: metric -> entries
        ia, ib = (sorted(json.dumps([k, v]) for k, v in (d.get("data") or {}).items()) for d in (da, db))
    else:
        ia, ib = (sorted(json.dumps(x, sort_keys=True) for x in d.get("data") or []) for d in (da, db))
    return "" if ia == ib else f"{len(ia)} vs {len(ib)} items; only on the single node {sorted(set(ia) - set(ib))[:3]}, " \
                               f"only through the cluster {sorted(set(ib) - set(ia))[:3]}"


def _json(raw: bytes) -> dict | None:
    try:
        return json.loads(raw)
    except ValueError:
        return None


def _notes(items: list[str] | None) -> list[str]:
    """Warnings/infos but the single node's note that an exact summary served the answer."""
    return [m for m in items or [] if not (m.startswith("TurboProm info:") and " served from summary " in m)]


def _doc(data: dict) -> bytes:
    return json.dumps({"status": "success", "data": data}).encode()


def _canon(data: dict) -> list[str]:
    return sorted(json.dumps(r, sort_keys=True) for r in data["result"])


def _same_value(a: str, b: str) -> bool:
    return compliance()._values_equal(float(a), float(b))


def pushdown_decisions(querier: str) -> Counter:
    """The querier's aggregations so far by decision (pushed / raw / fallback): the comparisons
    prove the pushdown only if it answered many of them."""
    text = http("GET", querier + "/metrics", {})[2].decode()
    return Counter({m.group(1): float(m.group(2)) for m in
                    re.finditer(r'^turboprom_cluster_pushdown_decisions_total\{decision="(\w+)"\} (\S+)$', text, re.M)})


# ------------------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def nodes(tmp_path_factory):
    require_binary("nats-server")
    require_binary("etcd")
    base = tmp_path_factory.mktemp("cluster-conf")
    single = ServerProcess(base / "single" / "data", extra_args=STORAGE_FLAGS)
    cluster = LocalCluster(base / "c", ingesters=len(INGESTERS), distributors=2, partitions=16, extra_args=STORAGE_FLAGS)
    try:
        single.start()
        cluster.start()
        yield single, cluster
    finally:
        cluster.stop()
        single.stop()


def compare_all(single: str, querier: str, requests: list[tuple[str, str, dict, dict]], parallel: int = 4,
                kinds: Counter | None = None) -> list[tuple[str, str]]:
    """(name, difference) of every request (name, path, params, headers) whose answers differ;
    ``kinds`` counts the single node's answers that were data, empty, or an error."""
    compliance()  # imported here first: load_bench is not safe to race from the worker threads
    def one(req: tuple[str, str, dict, dict]) -> tuple[str, str, str]:
        name, path, params, headers = req
        method = "POST" if path.startswith("/api/v1/query") else "GET"  # label values: GET only, as in Prometheus
        a = http(method, single + path, params, headers=headers, timeout=120)
        b = http(method, querier + path, params, headers=headers, timeout=120)
        doc = _json(a[2])
        if path.startswith("/api/v1/query"):
            kind = ("not JSON" if doc is None else "error" if doc.get("status") != "success"
                    else "data" if doc["data"]["result"] else "empty")
            return name, answers_differ((a[0], a[2]), (b[0], b[2])), kind
        kind = "error" if a[0] != 200 else "data" if doc and doc.get("data") else "empty"
        return name, lists_differ((a[0], a[2]), (b[0], b[2])), kind

    with ThreadPoolExecutor(parallel) as pool:
        results = list(pool.map(one, requests))
    if kinds is not None:
        kinds.update(k for _, _, k in results)
    return [(n, d) for n, d, _ in results if d]


# ------------------------------------------------------------------------------------------ tests


@dataclass
class ComplianceLoad:
    n_samples: int
    load_s: float
    end: float  # the query window's end (seconds)
    params: dict  # range-query parameters but the query
    cases: list


@pytest.fixture(scope="module")
def compliance_loaded(nodes) -> ComplianceLoad:
    """The compliance data in both (the default tenant), applied by every ingester."""
    single, cluster = nodes
    mod = compliance()
    t = time.monotonic()
    bodies, n_samples = compliance_bodies()
    write_all(single.url, bodies)
    write_all(cluster.url("distributor-0"), bodies[::2])
    write_all(cluster.url("distributor-1"), bodies[1::2])
    cluster.wait_applied(INGESTERS, timeout=180)
    end = mod.T0_S + (mod.DATA_MINUTES - 3) * 60 + 0.123  # the window bench/compliance.run uses
    cases = mod.expand_cases()
    assert len(cases) == 539
    return ComplianceLoad(n_samples, time.monotonic() - t, end, {"start": repr(end - 600), "end": repr(end), "step": "10"}, cases)


@pytest.mark.timeout(600)
def test_compliance_queries_through_the_cluster_equal_the_single_node(nodes, compliance_loaded):
    single, cluster = nodes
    mod = compliance()
    n_samples, load_s, end, params, cases = (compliance_loaded.n_samples, compliance_loaded.load_s, compliance_loaded.end,
                                             compliance_loaded.params, compliance_loaded.cases)
    t = time.monotonic()
    diffs: list[tuple[str, str]] = []
    # twice: with the default settings, where the single node's planner learns these queries as
    # they recur and answers some from exact summaries (saying so in infos; a querier's planner is
    # off, docs/cluster.md), and with exact=true, the raw path on both sides
    before = pushdown_decisions(cluster.url("querier-0"))
    for extra in ({}, {"exact": "true"}):
        reqs = [(f"{c.query} {extra}", "/api/v1/query_range", {**params, **extra, "query": c.query}, {}) for c in cases]
        diffs += compare_all(single.url, cluster.url("querier-0"), reqs)
    run_s = time.monotonic() - t
    decisions = pushdown_decisions(cluster.url("querier-0")) - before
    print(f"compliance aggregations through the querier: {dict(decisions)}")
    assert decisions["pushed"] >= 120, decisions  # 75 per pass at this writing: the set's sum/avg/topk/... over selectors and rates
    # the comparison proves something only if the single node answers with data
    answered = sum(1 for c in cases[:50] if json.loads(http("POST", single.url + "/api/v1/query_range",
                                                            {**params, "query": c.query})[2]).get("data", {}).get("result"))
    print(f"compliance through the cluster: {2 * len(cases)} queries, {2 * len(cases) - len(diffs)} equal; {n_samples} samples "
          f"loaded in {load_s:.1f}s, queries compared in {run_s:.1f}s")
    assert answered >= 40, answered
    # metric metadata travels with the writes: the querier answers it as the single node does
    meta = [(f"metadata {p}", "/api/v1/metadata", p, {}) for p in
            ({}, {"metric": "demo_num_cpus"}, {"metric": "demo_cpu_usage_seconds"}, {"limit": "3"}, {"limit_per_metric": "1"})]
    meta.append(("status/tsdb", "/api/v1/status/tsdb", {}, {}))  # cardinality lists and head time range
    meta_kinds: Counter = Counter()
    diffs += compare_all(single.url, cluster.url("querier-0"), meta, kinds=meta_kinds)
    assert meta_kinds["data"] == len(meta), meta_kinds
    # remote read (samples and streamed XOR chunks): the same samples, bit for bit
    rr = [(mod.T0_S * 1000, (mod.T0_S + 6000) * 1000, [(0, "__name__", "demo_cpu_usage_seconds_total")]),
          (int(end - 600) * 1000, int(end) * 1000, [(2, "__name__", "demo_.*"), (0, "instance", mod.INSTANCES[1])])]
    for streamed in (False, True):
        body = read_request(rr, streamed)
        (ca, ra, _), (cb, rb, _) = post_read(single.url, body), post_read(cluster.url("querier-0"), body)
        assert ca == cb == 200, (ca, cb)
        got = [streamed_of(r, len(rr), [q[:2] for q in rr]) if streamed else samples_of(r) for r in (ra, rb)]
        assert all(got[0]) and got[0] == got[1], f"remote read (streamed={streamed}) differs"
    assert not diffs, "\n".join(f"{q}: {d}" for q, d in diffs[:30])


def test_answers_differ_finds_each_kind_of_difference():
    """The comparison itself: equal answers pass, each kind of difference is reported."""
    def body(result, typ="matrix", **extra) -> tuple[int, bytes]:
        return 200, json.dumps({"status": "success", "data": {"resultType": typ, "result": result}, **extra}).encode()

    m = {"__name__": "up", "job": "a"}
    base = body([{"metric": m, "values": [[10, "1"], [20, "2.5"]]}])
    assert answers_differ(base, base) == ""
    assert answers_differ(base, body([{"metric": m, "values": [[10, "1.000001"], [20, "2.5"]]}])) == ""  # within 1e-5
    assert "value differs" in answers_differ(base, body([{"metric": m, "values": [[10, "1.001"], [20, "2.5"]]}]))
    assert "series differ" in answers_differ(base, body([{"metric": {**m, "job": "b"}, "values": [[10, "1"], [20, "2.5"]]}]))
    assert "timestamps differ" in answers_differ(base, body([{"metric": m, "values": [[10, "1"]]}]))
    assert "result type" in answers_differ(base, body([{"metric": m, "value": [10, "1"]}], "vector"))
    vec = body([{"metric": m, "value": [10, "NaN"]}], "vector")
    assert answers_differ(vec, vec) == "" and "value differs" in answers_differ(vec, body([{"metric": m, "value": [10, "1"]}], "vector"))
    assert "scalar" in answers_differ(body([10, "1"], "scalar"), body([10, "2"], "scalar"))
    assert "string" in answers_differ(body([10, "a"], "string"), body([10, "b"], "string"))
    assert answers_differ(body([10, "a"], "string"), body([10, "a"], "string")) == ""
    err = (400, json.dumps({"status": "error", "errorType": "bad_data", "error": "x"}).encode())
    assert answers_differ(err, err) == ""
    assert answers_differ(err, (422, json.dumps({"status": "error", "errorType": "execution", "error": "x"}).encode()))
    assert "HTTP" in answers_differ(base, err)
    assert "warnings" in answers_differ(base, body([{"metric": m, "values": [[10, "1"], [20, "2.5"]]}], warnings=["w"]))
    served = "TurboProm info: rate(x[...]) served from summary s1 (algorithm exact, pane 5s, exact); pass exact=true"
    assert answers_differ(body([], infos=[served]), body([])) == ""
    assert "infos" in answers_differ(body([], infos=["other"]), body([]))


def _seconds(ms: int) -> str:
    return f"{ms / 1000:.3f}"


def eval_requests(ep: Epoch) -> list[tuple[str, str, dict, dict]]:
    """An epoch's evals as API requests under its tenant, as the corpus runner (promql/promqltest.py)
    runs them: a range eval as a range query; an instant eval as an instant query at its time, again
    with ``@ t`` pinned and evaluated at the other times (FORMAT.md 4.4.1), and each of those as a
    range query around its time (4.4.2) unless the eval is excluded from that."""
    hdr = {"X-Scope-OrgID": ep.tenant}
    out = []
    for e, ast in ep.evals:
        name = f"{ep.tenant} line {e.line}: {e.expr}"
        if e.is_range:
            p = {"query": e.expr, "start": _seconds(e.start_ms), "end": _seconds(e.end_ms), "step": _seconds(e.step_ms)}
            out.append((name, "/api/v1/query_range", p, hdr))
            continue
        runs = [(e.expr, e.eval_ms)]
        if ast is not None:
            try:
                runs += at_modifier_cases(e.expr, e.eval_ms, ast)
            except TypeError:  # the printer cannot render it: the runner fails such an eval too
                pass
        for expr, t in runs:
            at = "" if (expr, t) == (e.expr, e.eval_ms) else f" [as {expr} at {t}ms]"
            out.append((name + at, "/api/v1/query", {"query": expr, "time": _seconds(t)}, hdr))
            if not (e.exclude_from_range_query or _QUERY_CONTEXT_FUNCS.search(expr)):
                p = {"query": expr, "start": _seconds(t - 60_000), "end": _seconds(t + 60_000), "step": "60"}
                out.append((name + at + " [range mode]", "/api/v1/query_range", p, hdr))
    return out


def label_requests(ep: Epoch) -> list[tuple[str, str, dict, dict]]:
    """The series, label names and metric names an epoch's tenant holds, over all of its time."""
    hdr = {"X-Scope-OrgID": ep.tenant}
    span = {"start": "0", "end": _seconds(max([c.interval_ms * max(map(len, c.series.values()), default=0) for c in ep.loads], default=0))}
    return [(f"{ep.tenant} {path}", path, {**span, **extra}, hdr) for path, extra in (
        ("/api/v1/series", {"match[]": '{__name__=~".+"}'}), ("/api/v1/labels", {}), ("/api/v1/label/__name__/values", {}))]


@pytest.mark.timeout(600)
def test_promqltest_corpus_through_the_cluster_equals_the_single_node(nodes):
    single, cluster = nodes
    t = time.monotonic()
    corpus = corpus_epochs(PROMQLTEST_FILES)
    dists = [cluster.url("distributor-0"), cluster.url("distributor-1")]
    for i, ep in enumerate(corpus.epochs):
        hdr = {"X-Scope-OrgID": ep.tenant}
        bodies = load_bodies(ep.loads)
        write_all(single.url, bodies, hdr)
        write_all(dists[i % 2], bodies, hdr)
    cluster.wait_applied(INGESTERS, timeout=180)
    load_s = time.monotonic() - t
    t = time.monotonic()
    reqs = [r for ep in corpus.epochs for r in eval_requests(ep)]
    kinds: Counter = Counter()
    before = pushdown_decisions(cluster.url("querier-0"))
    diffs = compare_all(single.url, cluster.url("querier-0"), reqs, kinds=kinds)
    decisions = pushdown_decisions(cluster.url("querier-0")) - before
    print(f"corpus aggregations through the querier: {dict(decisions)}")
    assert decisions["pushed"] >= 1000, decisions  # 1,710 at this writing
    lists = [r for ep in corpus.epochs for r in label_requests(ep)]
    list_kinds: Counter = Counter()
    list_diffs = compare_all(single.url, cluster.url("querier-0"), lists, kinds=list_kinds)
    run_s = time.monotonic() - t
    n_evals = sum(len(ep.evals) for ep in corpus.epochs)
    print(f"promqltest through the cluster: {len(PROMQLTEST_FILES)} files, {len(corpus.epochs)} data states (tenants), "
          f"{n_evals} evals as {len(reqs)} queries compared, {len(reqs) - len(diffs)} equal (single node: {dict(kinds)}), "
          f"{corpus.skipped_native} native-histogram evals not run; {len(lists)} series/labels requests compared, "
          f"{len(lists) - len(list_diffs)} equal ({dict(list_kinds)}); loaded in {load_s:.1f}s, compared in {run_s:.1f}s")
    assert kinds["data"] >= len(reqs) // 2, kinds
    assert list_kinds["data"] >= len(lists) * 9 // 10, list_kinds
    diffs += list_diffs
    assert not diffs, "\n".join(f"{q}: {d}" for q, d in diffs[:30])


def test_federate_through_the_cluster_equals_the_single_node(nodes):
    """/federate (latest sample of each series within the lookback before now, with the families'
    TYPE lines from the metadata the writes carried), over recent samples under a tenant of its own."""
    single, cluster = nodes
    hdr = {"X-Scope-OrgID": "federate-check"}
    now = int(time.time() * 1000) // 1000 * 1000
    series = {}
    for i in range(40):
        for name in ("fed_requests_total", "fed_queue_depth"):
            labels = tuple(sorted({"__name__": name, "instance": f"w{i}:9100", "job": "fleet", "gpu": str(i % 8)}.items()))
            series[labels] = [(now - 60_000 + k * 15_000, float(i * 10 + k)) for k in range(4)]
    body = write_request(series, [("fed_requests", 1, "Requests."), ("fed_queue_depth", 2, "Queue depth.")])
    write_all(single.url, [body], hdr)
    write_all(cluster.url("distributor-0"), [body], hdr)
    cluster.wait_applied(INGESTERS, timeout=60)
    for match in ('{__name__=~"fed_.+"}', "fed_queue_depth", '{job="fleet", gpu="3"}'):
        a = http("GET", single.url + "/federate", {"match[]": match}, headers=hdr)
        b = http("GET", cluster.url("querier-0") + "/federate", {"match[]": match}, headers=hdr)
        assert a[0] == b[0] == 200, (a[0], b[0], b[2][:300])
        assert b"# TYPE fed_queue_depth gauge" in a[2] and a[2].count(b"\n") > 10, a[2][:300]
        assert a[2] == b[2], f"{match}: {a[2][:300]!r} vs {b[2][:300]!r}"


@pytest.mark.timeout(600)
def test_compliance_queries_with_an_ingester_killed_equal_the_single_node(nodes, compliance_loaded):
    """With one of the three ingesters SIGKILLed, its partitions are read from their other owner:
    still every answer equal, nothing missing, nothing counted twice. (Last in the module: the
    cluster is whole again after it.)"""
    single, cluster = nodes
    cluster.roles["ingester-1"].kill()
    try:
        t = time.monotonic()
        p = {**compliance_loaded.params, "exact": "true"}
        reqs = [(c.query, "/api/v1/query_range", {**p, "query": c.query}, {}) for c in compliance_loaded.cases]
        kinds: Counter = Counter()
        before = pushdown_decisions(cluster.url("querier-0"))
        diffs = compare_all(single.url, cluster.url("querier-0"), reqs, kinds=kinds)
        decisions = pushdown_decisions(cluster.url("querier-0")) - before
        print(f"compliance with ingester-1 killed: {len(reqs)} queries, {len(reqs) - len(diffs)} equal "
              f"({dict(kinds)}) in {time.monotonic() - t:.1f}s; aggregations {dict(decisions)}")
        assert decisions["pushed"] >= 60, decisions
        assert kinds["data"] >= len(reqs) // 2, kinds
        assert not diffs, "\n".join(f"{q}: {d}" for q, d in diffs[:30])
    finally:
        cluster.add_role("ingester", "ingester-1")
        cluster.wait_ready("ingester-1")


def test_metadata_merge_keeps_the_single_node_order():
    """Metric names sorted; each metric's distinct entries in the order first seen; per-metric limit."""
    from turboprom.cluster.fanout_metadata import merge_metadata

    g = {"type": "gauge", "help": "h", "unit": ""}
    c = {"type": "counter", "help": "h", "unit": ""}
    merged = merge_metadata([{"b": [g], "a": [g, c]}, {"a": [c], "c": [c]}])
    assert list(merged) == ["a", "b", "c"] and merged["a"] == [g, c] and merged["b"] == [g]
    assert merge_metadata([{"a": [g, c]}], limit_per_metric=1) == {"a": [g]}
