"""The demo's recurring dashboard workload: every refresh, each panel of the bundled Grafana
dashboards is queried over the last hour (the bundled dashboards' range), as Grafana does, so the planner sees recurring work.

Every ``pan_every_s`` a viewer also pans the dashboards back to an earlier hour of the written
history (as when looking into a past incident): the same panel queries over a window the step
answers mostly do not hold, which is where summaries pay; refreshes of the last hour compute only
their newest steps, and the planner answers those raw where raw is cheaper."""
from __future__ import annotations

import json
import logging
import random
import threading
import time
import urllib.parse
import urllib.request

from turboprom.dashboards import DASHBOARDS

log = logging.getLogger("turboprom.demo")


class DashboardWorkload:
    def __init__(self, base_url: str, refresh_s: float = 10.0, range_s: float = 3600.0, step_s: float = 15.0,
                 history_s: float = 0.0, pan_every_s: float = 60.0, seed: int = 0):
        self.base, self.refresh_s, self.range_s, self.step_s = base_url.rstrip("/"), refresh_s, range_s, step_s
        self.history_s, self.pan_every_s = history_s, pan_every_s
        self._rng = random.Random(seed)
        self._started = time.time()
        self._last_pan = time.time()
        self.pans = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.queries = 0
        self.errors = 0

    def run_once(self, end: float | None = None) -> None:
        # start and end on multiples of the step, as Grafana aligns them: refreshes repeat step times,
        # so the steps no new sample touched are answered from earlier refreshes
        end = (time.time() if end is None else end) // self.step_s * self.step_s
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
            if self.pan_every_s > 0 and t - self._last_pan >= self.pan_every_s:
                self._last_pan = t
                self.pan_back(t)
            self._stop.wait(max(0.0, self.refresh_s - (time.time() - t)))

    def pan_back(self, now: float) -> None:
        """The dashboards over an earlier hour: one ending between 5 minutes and the oldest written
        history (plus what the demo has recorded since) ago."""
        oldest = self.history_s + (now - self._started) - self.range_s
        if oldest < 600:
            return
        self.pans += 1
        self.run_once(now - self._rng.uniform(300, oldest))

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="demo-dashboards", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
