"""A client that disconnects mid-query stops the engine: the worker thread is freed long before the
query would have finished, and the server counts it."""
from __future__ import annotations

import socket
import time
import urllib.parse
from pathlib import Path

from tests.helpers import ServerProcess, http_json
from tests.test_ingest_support import metric_value


def test_client_disconnect_cancels_query(tmp_path: Path) -> None:
    with ServerProcess(tmp_path / "data", ["--query.timeout=5m"]) as srv:
        now = int(time.time())
        body = "".join(f'cancel_me{{i="{i}"}} {i} {(now - 60 * k) * 1000}\n'
                       for k in range(70, -1, -1) for i in range(3000)).encode()  # present over the last 70 min
        st, _, _ = http_json(srv.url + "/api/v1/import/prometheus", body, {"Content-Type": "text/plain"})
        assert st in (200, 204)
        # Minutes of work: 3000 series x 2000 steps x 300-point windows, in ~23 blocks of series; the
        # engine checks for cancellation between blocks.
        q = urllib.parse.urlencode({"query": "stddev_over_time((cancel_me + time())[5m:1s])",
                                    "start": now - 2000, "end": now, "step": 1})
        sock = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
        sock.sendall(f"GET /api/v1/query_range?{q} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        time.sleep(2.5)
        # Still running (the handler has not answered): a finished query_range would be counted here.
        assert _finished_range_queries(srv.url) == 0
        sock.close()  # the client goes away
        deadline = time.time() + 60
        while _finished_range_queries(srv.url) == 0 and time.time() < deadline:
            time.sleep(0.2)
        # The engine stopped at its next budget check (one series block), minutes before the query would end.
        assert _finished_range_queries(srv.url) == 1
        assert metric_value(srv.url, "turboprom_queries_canceled_by_client_total") == 1
        st, out, _ = http_json(srv.url + "/api/v1/query?query=count(cancel_me)")
        assert st == 200 and out["data"]["result"][0]["value"][1] == "3000"


def _finished_range_queries(url: str) -> float:
    return metric_value(url, "turboprom_http_requests_total", handler="/api/v1/query_range")
