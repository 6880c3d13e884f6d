"""A/B of TSDB.select against the storage package of an earlier commit, same process, same data.

usage: .venv/bin/python bench/storage_select_ab.py --baseline-commit COMMIT [--case all|fleet|wide]
                                                    [--head-hours 2] [--reads 300] [--wide-hours 24]
                                                    [--wide-hosts 64]

The baseline's ``storage/`` is extracted with ``git archive`` and imported under another package
name, so both stores run in this one process and see the same machine load; reads alternate which
store goes first and every answer is checked identical (labels, offsets, timestamps, value bits).

fleet: the small selects of a Grafana panel or a planner refresh. bench/vllm_fleet.py's fleet
(63 engines x 79 series = 4,977 series, its label sets), ``--head-hours`` of samples every 5 s in the
head, appended as one scrape-shaped batch per 5 s and sealed after each (the server's maintenance
thread seals once a second, writes come every 5 s), so the head holds the LSM runs a live server
has. Reads: ``vllm:num_requests_running`` (63 series) over [t-5m, t] (an instant query's lookback)
and [t-1h, t]; ``vllm:time_to_first_token_seconds_bucket`` (1,449 series) over [t-5m, t];
``{model_name=~"meta-llama/.*", __name__="vllm:num_requests_waiting"}`` (38 series) over [t-5m, t];
then the whole instant query ``sum by (model_name) (vllm:num_requests_running)`` through this
checkout's PromQL engine over each store.

wide: the wide, long panels of issue 17 from blocks. ``--wide-hosts`` x 8 CPUs x 8 modes
``node_cpu_seconds_total`` series (4,096 by default) at 15 s over ``--wide-hours``, cut into
2-hour Parquet blocks and compacted (as a server's maintenance does), the newest 2-3 h in the head.
Reads: all of them over [now-24h, now] (``sum by (mode) (rate(...[5m]))`` over 24 h reads this),
one host's 64 series over 24 h (a per-host panel), and all of them over [now-1h, now].

Prints per read: median and p90 of each store, current/baseline ratio of the medians.
"""
from __future__ import annotations

import argparse
import importlib
import io
import re
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import storage.tsdb as cur_tsdb  # noqa: E402
from storage.labels import make_labels  # noqa: E402
from vllm_fleet import Fleet  # noqa: E402

BASE_PKG = "baseline_storage"


def load_baseline(commit: str, tmp: Path):
    """The storage package of ``commit``, importable as ``baseline_storage`` (its own modules)."""
    tar = subprocess.run(["git", "-C", str(ROOT), "archive", commit, "storage"], check=True, capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(tar)) as tf:
        tf.extractall(tmp, filter="data")
    src_dir, dst_dir = tmp / "storage", tmp / BASE_PKG
    src_dir.rename(dst_dir)
    for p in dst_dir.glob("*.py"):
        text = p.read_text()
        text = re.sub(r"^(\s*)from storage(\.| import)", rf"\1from {BASE_PKG}\2", text, flags=re.M)
        text = re.sub(r"^(\s*)import storage\.", rf"\1import {BASE_PKG}.", text, flags=re.M)
        p.write_text(text)
    # one set of self-metrics (a second registration of the same names is refused)
    (dst_dir / "metrics.py").write_text("from storage.metrics import *  # noqa: F401,F403\n")
    sys.path.insert(0, str(tmp))
    return importlib.import_module(f"{BASE_PKG}.tsdb"), importlib.import_module(f"{BASE_PKG}.matchers"), \
        importlib.import_module(f"{BASE_PKG}.batch"), importlib.import_module(f"{BASE_PKG}.options")


def open_stores(tmp: Path, base) -> dict:
    import storage.batch
    import storage.matchers
    import storage.options
    b_tsdb, b_match, b_batch, b_opts = base
    stores = {}
    for name, tsdb_mod, opts_mod, match_mod, batch_mod in (
            ("baseline", b_tsdb, b_opts, b_match, b_batch),
            ("current", cur_tsdb, storage.options, storage.matchers, storage.batch)):
        d = tmp / name
        d.mkdir()
        db = tsdb_mod.TSDB(str(d), opts_mod.StorageOptions(wal_fsync="never", retention_ms=0), background=False)
        stores[name] = (db, match_mod.Matcher, batch_mod.SampleBatch)
    return stores


def same(a, b) -> bool:
    return (a.labels == b.labels and np.array_equal(a.offsets, b.offsets) and np.array_equal(a.timestamps, b.timestamps)
            and np.array_equal(a.values.view(np.uint64), b.values.view(np.uint64)))


def run_reads(stores: dict, reads: list[tuple[str, list[tuple[str, str, str]], int, int]], n: int) -> None:
    times: dict[tuple[str, str], list[float]] = {}
    for i in range(n):
        order = ("baseline", "current") if i % 2 else ("current", "baseline")
        for desc, ms, lo, hi in reads:
            out = {}
            for name in order:
                db, Matcher, _ = stores[name]
                matchers = [Matcher(*m) for m in ms]
                t0 = time.perf_counter()
                out[name] = db.select(matchers, lo, hi)
                times.setdefault((name, desc), []).append(time.perf_counter() - t0)
            if not same(out["baseline"], out["current"]):
                raise SystemExit(f"answers differ: {desc}")
    for desc, ms, lo, hi in reads:
        line = []
        for name in ("baseline", "current"):
            xs = sorted(times[(name, desc)])
            line.append(f"{name} {statistics.median(xs) * 1e3:8.3f} ms (p90 {xs[int(0.9 * len(xs))] * 1e3:7.3f})")
        ratio = statistics.median(times[("current", desc)]) / statistics.median(times[("baseline", desc)])
        print(f"{desc:58s} " + " | ".join(line) + f" | current/baseline {ratio:.2f}", flush=True)


def fleet_case(stores: dict, head_hours: float, reads: int) -> None:
    fleet = Fleet(63)
    labels = [make_labels(lb) for lb in fleet.labels]
    n = int(head_hours * 3600 / 5)
    now = int(time.time() * 1000) // 5000 * 5000
    base = now - (n - 1 - np.arange(n, dtype=np.int64)) * 5000  # write times, every 5 s up to now
    t0 = time.perf_counter()
    idx = np.arange(len(labels))
    for k0 in range(0, n, 120):
        ts, vals = fleet.step(base[k0:k0 + 120])
        for k in range(ts.shape[1]):
            for name in ("baseline", "current"):
                db, _, SampleBatch = stores[name]
                db.append(SampleBatch(labels, idx, np.ascontiguousarray(ts[:, k]), np.ascontiguousarray(vals[:, k])))
                db.head.seal()
    print(f"fleet: {len(labels)} series, {n} samples each in the head ({len(labels) * n / 1e6:.1f}M), "
          f"{len(stores['current'][0].head._runs)} runs; loaded both in {time.perf_counter() - t0:.0f} s", flush=True)
    run = [("__name__", "=", "vllm:num_requests_running")]
    reads_l = [("num_requests_running (63 series), [t-5m, t]", run, now - 300_000 + 1, now),
               ("num_requests_running (63 series), [t-1h, t]", run, now - 3_600_000 + 1, now),
               ("ttft _bucket (1,449 series), [t-5m, t]", [("__name__", "=", "vllm:time_to_first_token_seconds_bucket")],
                now - 300_000 + 1, now),
               ("waiting, model_name=~meta-llama/.* (38 series), [t-5m, t]",
                [("__name__", "=", "vllm:num_requests_waiting"), ("model_name", "=~", "meta-llama/.*")], now - 300_000 + 1, now)]
    run_reads(stores, reads_l, reads)
    engine_reads(stores, [("instant sum by (model_name) (vllm:num_requests_running)",
                           "sum by (model_name) (vllm:num_requests_running)", now)], reads)


def engine_reads(stores: dict, queries: list[tuple[str, str, int]], n: int) -> None:
    """Whole instant queries through this checkout's PromQL engine over each store."""
    from promql.engine import Engine
    engines = {name: Engine(db) for name, (db, _, _) in stores.items()}
    times: dict[tuple[str, str], list[float]] = {}
    for i in range(n):
        order = ("baseline", "current") if i % 2 else ("current", "baseline")
        for desc, q, t in queries:
            out = {}
            for name in order:
                t0 = time.perf_counter()
                r = engines[name].instant_query(q, t)
                times.setdefault((name, desc), []).append(time.perf_counter() - t0)
                out[name] = (r.labels, r.values.tobytes())
            if out["baseline"] != out["current"]:
                raise SystemExit(f"answers differ: {desc}")
    for desc, _, _ in queries:
        b, c = (statistics.median(times[(name, desc)]) for name in ("baseline", "current"))
        print(f"{desc:58s} baseline {b * 1e3:8.3f} ms | current {c * 1e3:8.3f} ms | current/baseline {c / b:.2f}", flush=True)


def wide_case(stores: dict, hours: float, hosts: int, reads: int) -> None:
    modes = ["idle", "iowait", "irq", "nice", "softirq", "steal", "system", "user"]
    labels = [make_labels({"__name__": "node_cpu_seconds_total", "instance": f"node-{h:03d}:9100", "job": "node",
                           "cpu": str(c), "mode": m}) for h in range(hosts) for c in range(8) for m in modes]
    S = len(labels)
    n = int(hours * 3600 / 15)
    now = int(time.time() * 1000) // 15_000 * 15_000
    t_first = now - (n - 1) * 15_000
    rng = np.random.default_rng(5)
    rate = rng.uniform(0.001, 0.9, S)
    idx = np.repeat(np.arange(S), 240)
    t0 = time.perf_counter()
    for k0 in range(0, n, 240):
        m = min(240, n - k0)
        ts = t_first + (k0 + np.tile(np.arange(m), S)) * 15_000
        vals = np.round((k0 + np.tile(np.arange(m), S)) * 15 * np.repeat(rate, m), 2)
        for name in ("baseline", "current"):
            db, _, SampleBatch = stores[name]
            db.append(SampleBatch(labels, idx[: S * m] if m == 240 else np.repeat(np.arange(S), m), ts, vals))
            db.head.seal()
            db.maintain()  # cuts due head ranges into blocks, compacts
    st = stores["current"][0].stats()
    print(f"wide: {S} series x {n} samples ({S * n / 1e6:.1f}M) at 15 s; {len(st['blocks'])} blocks, "
          f"{st['headStats']['numSamples'] / 1e6:.1f}M samples in the head; loaded both in {time.perf_counter() - t0:.0f} s",
          flush=True)
    cpu = [("__name__", "=", "node_cpu_seconds_total")]
    day = now - int(hours * 3_600_000) + 1
    reads_l = [(f"node_cpu_seconds_total ({S} series), [now-{hours:g}h, now]", cpu, day, now),
               ("one host's node_cpu (64 series), [now-24h, now]", cpu + [("instance", "=", "node-007:9100")], day, now),
               (f"node_cpu_seconds_total ({S} series), [now-1h, now]", cpu, now - 3_600_000 + 1, now)]
    run_reads(stores, reads_l, reads)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--baseline-commit", required=True)
    ap.add_argument("--case", choices=("all", "fleet", "wide"), default="all")
    ap.add_argument("--head-hours", type=float, default=2)
    ap.add_argument("--reads", type=int, default=300)
    ap.add_argument("--wide-hours", type=float, default=24)
    ap.add_argument("--wide-hosts", type=int, default=64)
    ap.add_argument("--wide-reads", type=int, default=7)
    a = ap.parse_args()
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", a.baseline_commit], check=True,
                            capture_output=True, text=True).stdout.strip()
    print(f"baseline {commit}, current = working tree", flush=True)
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        (tmp / "pkg").mkdir()
        base = load_baseline(a.baseline_commit, tmp / "pkg")
        if a.case in ("all", "fleet"):
            (tmp / "fleet").mkdir()
            stores = open_stores(tmp / "fleet", base)
            fleet_case(stores, a.head_hours, a.reads)
            for db, _, _ in stores.values():
                db.close()
        if a.case in ("all", "wide"):
            (tmp / "wide").mkdir()
            stores = open_stores(tmp / "wide", base)
            wide_case(stores, a.wide_hours, a.wide_hosts, a.wide_reads)
            for db, _, _ in stores.values():
                db.close()


if __name__ == "__main__":
    main()
