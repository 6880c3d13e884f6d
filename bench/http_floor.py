"""The per-request floor of a range query over HTTP: TurboProm vs Prometheus 2.42, same requests.

Queries that need no stored data (``vector(time())`` and ``label_replace`` copies of it), so the
answer's size is all that varies: 1 point, 4 series x 241 steps (a 1 h panel at 15 s), 4 x 1441 (a
24 h panel at 60 s). Each request is sent back to back and after an idle gap (``--gap-ms``, 50 ms
by default), as a dashboard refresh arrives after seconds of idleness: the first request after a
gap pays the wake-up of idle threads on both sides. Reported per server and shape: median wall time
(request sent -> whole body read, keep-alive connection), and for TurboProm the server's own
``execTotalTime`` (queue + evaluation + encoding) and ``evalTotalTime`` from ``stats``. Servers
alternate request by request, so both see the same machine load. Runs ~1 minute.

    .venv/bin/python bench/http_floor.py [--repeat 60] [--gap-ms 50] [--skip-prometheus]
"""
from __future__ import annotations

import argparse
import http.client
import json
import statistics
import sys
import tempfile
import time
import urllib.parse
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.helpers import ServerProcess  # noqa: E402
from tests.test_api_helpers import PrometheusPeer  # noqa: E402


def _series(k: int) -> str:
    return " or ".join(f'label_replace(vector(time() * {i}), "copy", "{i}", "", "")' for i in range(1, k + 1))


def shapes(now: int) -> list[tuple[str, dict[str, str]]]:
    return [("1 point", {"query": "vector(1)", "start": str(now), "end": str(now), "step": "15"}),
            ("4 x 241 (1 h / 15 s)", {"query": _series(4), "start": str(now - 3600), "end": str(now), "step": "15"}),
            ("4 x 1441 (24 h / 60 s)", {"query": _series(4), "start": str(now - 86400), "end": str(now), "step": "60"})]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=60)
    ap.add_argument("--gap-ms", type=float, default=50.0)
    ap.add_argument("--skip-prometheus", action="store_true")
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="http-floor-"))
    tp = ServerProcess(work / "tp-data", ["--wal-fsync", "never"]).start()
    prom = None if a.skip_prometheus else PrometheusPeer(work / "prom").start()
    try:
        conns = {"turboprom": http.client.HTTPConnection("127.0.0.1", tp.port)}
        if prom is not None:
            conns["prometheus"] = http.client.HTTPConnection("127.0.0.1", prom.port)
        now = int(time.time()) // 60 * 60
        print(f"{'shape':24s} {'gap':>6s} " + " ".join(f"{n + ' ms':>15s}" for n in conns)
              + "  turboprom exec / eval ms  bytes" + ("  turboprom/prometheus" if prom else ""))
        for label, params in shapes(now):
            qs = urllib.parse.urlencode(dict(params, stats="1"))
            for gap in (0.0, a.gap_ms / 1000):
                wall: dict[str, list[float]] = {n: [] for n in conns}
                exec_s, eval_s, size = [], [], 0
                for r in range(a.repeat + 3):
                    for name in (list(conns) if r % 2 else list(reversed(conns))):
                        time.sleep(gap)
                        t0 = time.perf_counter()
                        conns[name].request("GET", "/api/v1/query_range?" + qs)
                        resp = conns[name].getresponse()
                        body = resp.read()
                        dt = time.perf_counter() - t0
                        if resp.status != 200:
                            raise SystemExit(f"{name}: HTTP {resp.status}: {body[:200]!r}")
                        if r < 3:
                            continue  # warm-up
                        wall[name].append(dt)
                        if name == "turboprom":
                            t = json.loads(body)["data"]["stats"]["timings"]
                            exec_s.append(t["execTotalTime"])
                            eval_s.append(t["evalTotalTime"])
                            size = len(body)
                med = {n: 1e3 * statistics.median(v) for n, v in wall.items()}
                line = f"{label:24s} {gap * 1000:5.0f}ms " + " ".join(f"{med[n]:15.2f}" for n in conns)
                line += f"  {1e3 * statistics.median(exec_s):8.2f} / {1e3 * statistics.median(eval_s):5.2f}  {size:8d}"
                if prom is not None:
                    line += f"  {med['turboprom'] / med['prometheus']:8.2f}"
                print(line, flush=True)
    finally:
        tp.stop()
        if prom is not None:
            prom.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
