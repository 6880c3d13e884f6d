"""On-disk bytes per sample: TurboProm blocks vs Prometheus 2.42 vs VictoriaMetrics, same data.

usage: .venv/bin/python bench/storage_bytes.py [--series 500] [--hours 12] [--only ours]

Data sets (generated deterministically, ending one hour ago, 15 s interval with +-2 ms jitter):
  node     node-exporter-like: 40% cpu-seconds counters (2 decimals), 20% byte counters (integers),
           20% memory-like gauges (multiples of 4096, random walk), 20% constant gauges
  noisy    random full-precision float64 gauges (worst case for every compressor)
Each store gets identical samples:
  TurboProm       TSDB.append in time chunks, then flush_head() + compact() (Parquet blocks)
  Prometheus      `promtool tsdb create-blocks-from openmetrics --max-block-duration=24h`
                  (the backfill path; blocks as compaction would write them); size of block dirs
  VictoriaMetrics POST /api/v1/import/prometheus, /internal/force_flush, /internal/force_merge,
                  wait for merges to settle; size of storageDataPath (data + indexdb)
VictoriaMetrics stores values as decimals with limited precision (lossy on noisy floats); the
others are exact.
"""
from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from storage.batch import SampleBatch  # noqa: E402
from storage.block import write_block  # noqa: E402
from storage.labels import make_labels  # noqa: E402
from storage.options import HOUR_MS, StorageOptions  # noqa: E402
from storage.tsdb import TSDB  # noqa: E402


def dataset(kind: str, nseries: int, hours: float, seed: int = 7):
    rng = np.random.default_rng(seed)
    step = 15_000
    n = int(hours * HOUR_MS / step)
    end = (int(time.time() * 1000) - HOUR_MS) // step * step
    start = end - n * step
    out = []
    for i in range(nseries):
        ts = start + np.arange(n, dtype=np.int64) * step + rng.integers(-2, 3, n)
        if kind == "noisy":
            name = "noisy_gauge"
            vals = rng.normal(size=n) * 100.0
        else:
            r = i % 10
            if r < 4:
                name = "node_cpu_seconds_total"
                vals = np.round(np.cumsum(rng.uniform(0, 15, n)), 2)
            elif r < 6:
                name = "node_network_receive_bytes_total"
                vals = np.cumsum(rng.integers(0, 1_000_000, n)).astype(float)
            elif r < 8:
                name = "node_memory_MemFree_bytes"
                vals = (8_000_000_000 // 4096 + np.cumsum(rng.integers(-100, 101, n))) * 4096.0
            else:
                name = "node_filesystem_size_bytes"
                vals = np.full(n, 250_000_000_000.0)
        labels = make_labels({"__name__": name, "instance": f"host-{i // 10:03d}:9100", "job": "node", "idx": str(i % 10)})
        out.append((labels, ts, vals))
    return out


def om_name(labels) -> str:
    """Strict OpenMetrics rendering (no spaces), which promtool's parser requires."""
    name = dict(labels)["__name__"]
    inner = ",".join(f'{k}="{v}"' for k, v in labels if k != "__name__")
    return f"{name}{{{inner}}}"


def dir_bytes(path: Path) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            try:
                total += os.path.getsize(os.path.join(root, f))
            except FileNotFoundError:
                pass
    return total


def ours(data, workdir: Path) -> dict:
    d = workdir / "turboprom"
    db = TSDB(str(d), StorageOptions(block_duration_ms=2 * HOUR_MS, retention_ms=0), background=False)
    n = len(data[0][1])
    t0 = time.perf_counter()
    for c in range(0, n, 240):
        db.append(SampleBatch.from_series([(lb, ts[c:c + 240], v[c:c + 240]) for lb, ts, v in data]))
    db.flush_head()
    db.compact()
    ingest_s = time.perf_counter() - t0
    st = db.stats()
    db.close()
    blocks = dir_bytes(d / "blocks")
    data_only = sum(os.path.getsize(p) for p in (d / "blocks").glob("*/data.parquet"))
    # best case: all samples in one block (what a long enough compaction window reaches)
    one = workdir / "turboprom-one"
    one.mkdir()
    labels = [lb for lb, _, _ in data]
    sid = np.repeat(np.arange(len(data), dtype=np.int64), n)
    write_block(one, labels, sid, np.concatenate([x[1] for x in data]), np.concatenate([x[2] for x in data]))
    return {"bytes": blocks, "data_bytes": data_only, "blocks": len(st["blocks"]), "one_block_bytes": dir_bytes(one),
            "seconds": ingest_s}


def prometheus(data, workdir: Path, promtool: str) -> dict:
    om = workdir / "input.om"
    with open(om, "w") as f:
        by_name: dict[str, list] = {}
        for lb, ts, v in data:
            by_name.setdefault(dict(lb)["__name__"], []).append((lb, ts, v))
        for name, items in by_name.items():
            f.write(f"# TYPE {name} gauge\n")
            for lb, ts, v in items:
                prefix = om_name(lb)
                secs = [f"{t / 1000:.3f}" for t in ts.tolist()]
                f.write("".join(f"{prefix} {val!r} {s}\n" for val, s in zip(v.tolist(), secs)))
        f.write("# EOF\n")
    out = workdir / "prom"
    t0 = time.perf_counter()
    r = subprocess.run([promtool, "tsdb", "create-blocks-from", "openmetrics", "--max-block-duration=24h", "-q", str(om), str(out)],
                   check=False, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"promtool failed: {r.stderr[-2000:]}")
    secs = time.perf_counter() - t0
    chunks = sum(dir_bytes(p) for p in out.glob("*/chunks"))
    om.unlink()
    return {"bytes": dir_bytes(out), "data_bytes": chunks, "blocks": len(list(out.iterdir())), "seconds": secs}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str, timeout: float = 60) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read()


def victoria(data, workdir: Path, binary: str) -> dict:
    port = free_port()
    path = workdir / "vm"
    log = open(workdir / "vm.log", "wb")
    proc = subprocess.Popen([binary, f"-storageDataPath={path}", f"-httpListenAddr=127.0.0.1:{port}", "-retentionPeriod=100y",
                             "-search.disableCache"], stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            try:
                _get(base + "/health", 2)
                break
            except Exception:  # noqa: BLE001 - starting
                time.sleep(0.1)
        t0 = time.perf_counter()
        buf: list[str] = []
        size = 0

        def flush() -> None:
            nonlocal size
            if buf:
                req = urllib.request.Request(base + "/api/v1/import/prometheus", data="".join(buf).encode(), method="POST")
                urllib.request.urlopen(req, timeout=300).read()
                buf.clear()
                size = 0

        for lb, ts, v in data:
            prefix = om_name(lb)
            chunk = "".join(f"{prefix} {val!r} {t}\n" for val, t in zip(v.tolist(), ts.tolist()))
            buf.append(chunk)
            size += len(chunk)
            if size > 32 << 20:
                flush()
        flush()
        _get(base + "/internal/force_flush")
        months = sorted({time.strftime("%Y_%m", time.gmtime(int(ts[0]) / 1000)) for _, ts, _ in data} |
                        {time.strftime("%Y_%m", time.gmtime(int(ts[-1]) / 1000)) for _, ts, _ in data})
        for m in months:
            _get(base + f"/internal/force_merge?partition_prefix={m}")
        # wait until the size settles (merges finished)
        last, stable = -1, 0
        for _ in range(600):
            time.sleep(0.5)
            cur = dir_bytes(path / "data")
            stable = stable + 1 if cur == last else 0
            last = cur
            if stable >= 8:
                break
        secs = time.perf_counter() - t0
        return {"bytes": dir_bytes(path / "data") + dir_bytes(path / "indexdb"), "data_bytes": dir_bytes(path / "data"),
                "blocks": 0, "seconds": secs}
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        log.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--series", type=int, default=500)
    ap.add_argument("--hours", type=float, default=12)
    ap.add_argument("--only", default="ours,prometheus,victoria")
    a = ap.parse_args()
    which = set(a.only.split(","))
    for kind in ("node", "noisy"):
        data = dataset(kind, a.series, a.hours)
        n = sum(len(x[1]) for x in data)
        print(f"\n== {kind}: {a.series} series x {len(data[0][1])} samples = {n} samples")
        with tempfile.TemporaryDirectory() as d:
            work = Path(d)
            results = {}
            if "ours" in which:
                results["TurboProm"] = ours(data, work)
            if "prometheus" in which and shutil.which("promtool"):
                results["Prometheus 2.42"] = prometheus(data, work, shutil.which("promtool"))
            if "victoria" in which and os.path.exists("/usr/bin/victoria-metrics"):
                results["VictoriaMetrics 1.79"] = victoria(data, work, "/usr/bin/victoria-metrics")
            for name, r in results.items():
                extra = f", one-block {r['one_block_bytes'] / n:.3f} B/sample" if "one_block_bytes" in r else ""
                print(f"{name:22s} total {r['bytes'] / n:.3f} B/sample (samples-only {r['data_bytes'] / n:.3f}), "
                      f"{r['bytes']} bytes, blocks={r['blocks']}, {r['seconds']:.1f}s{extra}")
            if "TurboProm" in results:
                for name, r in results.items():
                    if name != "TurboProm":
                        print(f"ratio TurboProm/{name}: total {results['TurboProm']['bytes'] / r['bytes']:.2f}x")


if __name__ == "__main__":
    main()
