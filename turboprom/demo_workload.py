"""The demo's recurring dashboard workload: every refresh, each panel of the bundled Grafana
dashboards is queried over the last hour (the bundled dashboards' range), as Grafana does, so the planner sees recurring work."""
from __future__ import annotations

import json
import logging
import threading
import time
import urllib.parse
import urllib.request

from turboprom.dashboards import DASHBOARDS

log = logging.getLogger("turboprom.demo")


class DashboardWorkload:
    def __init__(self, base_url: str, refresh_s: float = 10.0, range_s: float = 3600.0, step_s: float = 15.0):
        self.base, self.refresh_s, self.range_s, self.step_s = base_url.rstrip("/"), refresh_s, range_s, step_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.queries = 0
        self.errors = 0

    def run_once(self) -> None:
        # start and end on multiples of the step, as Grafana aligns them: refreshes repeat step times,
        # so the steps no new sample touched are answered from earlier refreshes
        end = time.time() // self.step_s * self.step_s
        start = (end - self.range_s) // self.step_s * self.step_s
        for d in DASHBOARDS:
            for q in (q for p in d.panels for q in p.queries()):
                form = urllib.parse.urlencode({"query": q, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": str(self.step_s)}).encode()
                try:
                    with urllib.request.urlopen(urllib.request.Request(self.base + "/api/v1/query_range", data=form), timeout=60) as r:
                        json.loads(r.read())
                    self.queries += 1
                except Exception as e:  # noqa: BLE001 - a dashboard keeps refreshing through errors
                    self.errors += 1
                    log.debug("dashboard query failed: %s: %s", q, e)

    def _run(self) -> None:
        while not self._stop.is_set():
            t = time.time()
            self.run_once()
            self._stop.wait(max(0.0, self.refresh_s - (time.time() - t)))

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="demo-dashboards", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
