"""Responsiveness monitor for hostile-input tests.

While a hostile request runs against a real server, `ResponsivenessMonitor` polls light endpoints
(`/-/healthy`, `/api/v1/congestion`) from its own thread and records each poll's latency, so a test
can assert that the hostile work neither blocks the event loop nor starves the process. Every poll
has a client timeout; a poll that times out or fails is recorded as that timeout, so a stalled
server shows up as a high percentile instead of a hang.
"""
from __future__ import annotations

import base64
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field

DEFAULT_PATHS = ("/-/healthy", "/api/v1/congestion")


@dataclass
class PollStats:
    """Latencies (seconds) of the polls of one path, failures counted at the poll timeout."""

    path: str
    latencies: list[float] = field(default_factory=list)
    failures: int = 0

    def quantile(self, q: float) -> float:
        if not self.latencies:
            return float("nan")
        xs = sorted(self.latencies)
        i = min(len(xs) - 1, max(0, int(round(q * (len(xs) - 1)))))
        return xs[i]

    @property
    def p99(self) -> float:
        return self.quantile(0.99)

    def summary(self) -> str:
        return (f"{self.path}: n={len(self.latencies)} failures={self.failures} "
                f"p50={self.quantile(0.5) * 1000:.1f}ms p99={self.p99 * 1000:.1f}ms "
                f"max={max(self.latencies, default=float('nan')) * 1000:.1f}ms")


class ResponsivenessMonitor:
    """Polls `paths` on `base_url` every `interval` seconds until stopped (use as a context manager).

    `auth` is (user, password) for basic auth or a bearer token string; `headers` are sent as given.
    """

    def __init__(self, base_url: str, paths: tuple[str, ...] = DEFAULT_PATHS, *, interval: float = 0.02,
                 timeout: float = 5.0, auth: tuple[str, str] | str | None = None,
                 headers: dict[str, str] | None = None):
        self.base_url = base_url.rstrip("/")
        self.interval = interval
        self.timeout = timeout
        self.stats = {p: PollStats(p) for p in paths}
        self._headers = dict(headers or {})
        if isinstance(auth, tuple):
            token = base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
            self._headers["Authorization"] = f"Basic {token}"
        elif isinstance(auth, str):
            self._headers["Authorization"] = f"Bearer {auth}"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="responsiveness-monitor", daemon=True)

    def _poll(self, path: str) -> None:
        st = self.stats[path]
        req = urllib.request.Request(self.base_url + path, headers=self._headers)
        t0 = time.perf_counter()
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as r:
                r.read()
                ok = 200 <= r.status < 300
        except (urllib.error.URLError, OSError, TimeoutError):
            ok = False
        dt = time.perf_counter() - t0
        if not ok:
            st.failures += 1
            dt = max(dt, self.timeout)
        st.latencies.append(dt)

    def _run(self) -> None:
        while not self._stop.is_set():
            for path in self.stats:
                self._poll(path)
            self._stop.wait(self.interval)

    def start(self) -> "ResponsivenessMonitor":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(self.timeout + 5)

    def __enter__(self) -> "ResponsivenessMonitor":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def worst_p99(self) -> float:
        return max(st.p99 for st in self.stats.values())

    def report(self) -> str:
        return "; ".join(st.summary() for st in self.stats.values())

    def assert_responsive(self, p99_limit_s: float = 0.1, min_polls: int = 5) -> None:
        """Every path was polled at least `min_polls` times, never failed, and kept p99 under the limit."""
        for st in self.stats.values():
            assert len(st.latencies) >= min_polls, f"too few polls to judge: {self.report()}"
            assert st.failures == 0, f"polls failed while the hostile request ran: {self.report()}"
            assert st.p99 <= p99_limit_s, f"p99 above {p99_limit_s * 1000:.0f} ms: {self.report()}"
