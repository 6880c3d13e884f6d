"""Alert delivery to Alertmanager: the ``alerting:`` config section and the notifier that queues,
batches and sends alerts, as Prometheus's notifier/ package does.

The rule manager (planner/rules.py) hands each evaluation's due alerts to ``Notifier.send``; that
call only queues them (external labels added where the alert lacks them, then
``alerting.alert_relabel_configs``; an alert left without labels is dropped). A thread of its own
runs an asyncio loop with one aiohttp session that takes batches of up to 64 alerts from the queue
and POSTs each batch to every Alertmanager at once (``/api/v2/alerts``, Alertmanager's JSON), with
each set's own ``alert_relabel_configs`` applied, basic auth or a bearer token, TLS, and the set's
timeout. A failed send is retried twice (0.5 s, then 1 s later) while the queue is not full; after
that the batch is counted as an error for that Alertmanager (the rules resend firing alerts every
resend delay anyway). The queue holds 10000 alerts (``--alertmanager.notification-queue-capacity``)
and drops the oldest beyond that; on shutdown what is queued is still sent, for at most the timeout.

``alertmanagers_json()`` is ``/api/v1/alertmanagers``: one URL per target of ``static_configs``
after the set's ``relabel_configs`` (``__address__``, ``__scheme__``, ``__alerts_path__``), the
targets those drop listed as dropped.
"""
from __future__ import annotations

import asyncio
import collections
import datetime as _dt
import json
import logging
import posixpath
import threading
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import Counter, Gauge

from ingest.http_client_config import HTTP_CLIENT_FIELDS, HTTPClientConfig
from ingest.relabel import RelabelConfig, RelabelConfigError, parse_relabel_configs, relabel
from ingest.scrape.config import RELABEL_FIELDS
from turboprom.durations import parse_duration_ms

log = logging.getLogger("turboprom.notifier")

MAX_BATCH = 64
DEFAULT_QUEUE_CAPACITY = 10_000
RETRY_DELAYS_S = (0.5, 1.0)
USER_AGENT = "Prometheus/2.42.0"

# `alerting:` in the server YAML (checked by turboprom/config.py; the whole-section rules by parse_alerting).
ALERTMANAGER_FIELDS: dict[str, Any] = {
    "static_configs": [{"targets": ["str"], "labels": {"*": "str"}}],
    "scheme": ("=http", "=https"), "path_prefix": "str", "timeout": "duration", "api_version": "str",
    "relabel_configs": [RELABEL_FIELDS], "alert_relabel_configs": [RELABEL_FIELDS],
    **HTTP_CLIENT_FIELDS,
}
ALERTING_FIELDS: dict[str, Any] = {
    "alertmanagers": [ALERTMANAGER_FIELDS],
    "alert_relabel_configs": [RELABEL_FIELDS],
}

SENT = Counter("prometheus_notifications_sent", "Total number of alerts sent.", ["alertmanager"])
ERRORS = Counter("prometheus_notifications_errors", "Total number of errors sending alert notifications.",
                 ["alertmanager"])
DROPPED = Counter("prometheus_notifications_dropped", "Total number of alerts dropped due to errors when sending to Alertmanager.")
QUEUE_LENGTH = Gauge("prometheus_notifications_queue_length", "The number of alert notifications in the queue.")
DISCOVERED = Gauge("prometheus_notifications_alertmanagers_discovered", "The number of alertmanagers discovered and active.")


@dataclass
class AlertmanagerSet:
    """One entry of ``alerting.alertmanagers``: its targets' URLs and how to reach them."""

    urls: list[str]
    dropped: list[dict[str, str]]
    timeout_s: float = 10.0
    http: HTTPClientConfig = field(default_factory=HTTPClientConfig)
    alert_relabel: list[RelabelConfig] = field(default_factory=list)

    def headers(self) -> dict[str, str]:
        h = {"Content-Type": "application/json", "User-Agent": USER_AGENT}
        auth = self.http.authorization_header()
        if auth is not None:
            h["Authorization"] = auth
        return h


@dataclass
class AlertingConfig:
    sets: list[AlertmanagerSet] = field(default_factory=list)
    alert_relabel: list[RelabelConfig] = field(default_factory=list)


def parse_alerting(section: Any, base_dir: str | None = None) -> AlertingConfig:
    """The ``alerting:`` section (already shape-checked against ALERTING_FIELDS); ValueError naming
    the field for what the table cannot express (api_version, auth combinations, relabel rules).
    Password, credentials and TLS files are relative to ``base_dir`` (the config file's folder)."""

    section = section or {}
    if not isinstance(section, dict):
        raise ValueError("alerting: must be a mapping with alertmanagers and alert_relabel_configs")
    try:
        global_relabel = parse_relabel_configs(section.get("alert_relabel_configs"))
    except RelabelConfigError as e:
        raise ValueError(f"alerting.alert_relabel_configs: {e}") from None
    sets = []
    for i, am in enumerate(section.get("alertmanagers") or []):
        where = f"alerting.alertmanagers[{i}]"
        am = am or {}
        version = str(am.get("api_version", "v2"))
        if version != "v2":
            raise ValueError(f'{where}.api_version: "{version}" is not supported (only "v2": Alertmanager 0.25 '
                             "has no v1 API)")
        http = HTTPClientConfig.parse(am, where, base_dir)
        try:
            target_relabel = parse_relabel_configs(am.get("relabel_configs"))
            alert_relabel = parse_relabel_configs(am.get("alert_relabel_configs"))
        except RelabelConfigError as e:
            raise ValueError(f"{where}: relabel_configs: {e}") from None
        scheme = str(am.get("scheme", "http"))
        alerts_path = posixpath.join("/", str(am.get("path_prefix", "/") or "/").lstrip("/"), "api/v2/alerts")
        urls, dropped = [], []
        for sc in am.get("static_configs") or []:
            for target in (sc or {}).get("targets") or []:
                lset = {**{str(k): str(v) for k, v in ((sc or {}).get("labels") or {}).items()},
                        "__address__": str(target), "__scheme__": scheme, "__alerts_path__": alerts_path}
                out = relabel(lset, target_relabel)
                if out is None:
                    dropped.append(lset)
                    continue
                addr = out.get("__address__", "")
                if "/" in addr:
                    raise ValueError(f'{where}: "/" is an invalid character in the address {addr!r}')
                urls.append(f"{out.get('__scheme__', scheme)}://{addr}{out.get('__alerts_path__', alerts_path)}")
        timeout = am.get("timeout", "10s")
        timeout_s = float(timeout) if isinstance(timeout, (int, float)) else parse_duration_ms(str(timeout)) / 1000.0
        sets.append(AlertmanagerSet(urls, dropped, timeout_s, http, alert_relabel))
    return AlertingConfig(sets, global_relabel)


def external_labels(raw: dict[str, Any]) -> dict[str, str]:
    """``global.external_labels`` of the server YAML."""
    return {str(k): str(v) for k, v in ((raw.get("global") or {}).get("external_labels") or {}).items()}


def alerting_options(config: Any, raw: dict[str, Any]) -> Any:
    """planner.rules.AlertingOptions from a ServerConfig's flags and a config document ``raw``."""
    from planner.rules import AlertingOptions

    return AlertingOptions(external_labels=external_labels(raw),
                           external_url=config.external_url or f"http://{config.listen}",
                           resend_delay_s=config.alert_resend_delay_s,
                           outage_tolerance_s=config.alert_for_outage_tolerance_s,
                           grace_period_s=config.alert_for_grace_period_s)


def _go_json_time(ts: float) -> str:
    """RFC 3339 with milliseconds, as Prometheus's notifier marshals startsAt/endsAt."""
    if ts <= 0:
        return "0001-01-01T00:00:00.000Z"
    t = _dt.datetime.fromtimestamp(ts, _dt.timezone.utc)
    return t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{t.microsecond // 1000:03d}Z"


class Notifier:
    """Queue and deliver alerts to the configured Alertmanagers (see the module docstring)."""

    def __init__(self, config: AlertingConfig, external_labels: dict[str, str] | None = None,
                 capacity: int = DEFAULT_QUEUE_CAPACITY):
        self.config = config
        self.external_labels = dict(external_labels or {})
        self.capacity = capacity
        self._queue: collections.deque[dict[str, Any]] = collections.deque()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._more: asyncio.Event | None = None
        self._stopping = False
        DISCOVERED.set(sum(len(s.urls) for s in config.sets))

    # --- called from the rule evaluation thread --------------------------------------------
    def send(self, expr: str, alerts: list[dict[str, Any]]) -> None:
        """Queue ``alerts`` (planner.rules.NotifyFunc); never blocks on the network."""
        out = []
        for a in alerts:
            lset = dict(a["labels"])
            for k, v in self.external_labels.items():
                if not lset.get(k):
                    lset[k] = v
            lset = relabel(lset, self.config.alert_relabel)
            if not lset:
                continue
            out.append({"labels": lset, "annotations": dict(a.get("annotations") or {}),
                        "startsAt": _go_json_time(a["startsAt"]), "endsAt": _go_json_time(a["endsAt"]),
                        "generatorURL": a.get("generatorURL", "")})
        if not out:
            return
        with self._lock:
            self._queue.extend(out)
            over = len(self._queue) - self.capacity
            for _ in range(max(0, over)):
                self._queue.popleft()
            if over > 0:
                DROPPED.inc(over)
                log.warning("alert notification queue full: dropped %d oldest alerts", over)
            QUEUE_LENGTH.set(len(self._queue))
        self._wake()

    def apply(self, config: AlertingConfig, external_labels: dict[str, str]) -> None:
        """Config reload: the new Alertmanagers and relabeling take effect from the next batch."""
        with self._lock:
            self.config = config
            self.external_labels = dict(external_labels)
        DISCOVERED.set(sum(len(s.urls) for s in config.sets))

    def alertmanagers_json(self) -> dict[str, Any]:
        return {"activeAlertmanagers": [{"url": u} for s in self.config.sets for u in s.urls],
                "droppedAlertmanagers": [{"url": f"{d.get('__scheme__', 'http')}://{d.get('__address__', '')}"
                                                 f"{d.get('__alerts_path__', '')}"} for s in self.config.sets
                                         for d in s.dropped]}

    # --- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is None:
            started = threading.Event()
            self._thread = threading.Thread(target=self._run, args=(started,), name="alert-notifier", daemon=True)
            self._thread.start()
            started.wait(10)

    def stop(self) -> None:
        self._stopping = True
        self._wake()
        if self._thread is not None:
            self._thread.join(timeout=15)
            self._thread = None

    def _wake(self) -> None:
        loop, more = self._loop, self._more
        if loop is not None and more is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(more.set)
            except RuntimeError:  # the loop just closed (shutdown)
                pass

    def _run(self, started: threading.Event) -> None:
        asyncio.run(self._main(started))

    async def _main(self, started: threading.Event) -> None:
        import aiohttp

        self._loop = asyncio.get_running_loop()
        self._more = asyncio.Event()
        started.set()
        async with aiohttp.ClientSession() as session:
            while True:
                batch = self._next_batch()
                if batch:
                    await self._send_all(session, batch)
                    continue
                if self._stopping:
                    return
                self._more.clear()
                if self._queue or self._stopping:
                    continue
                await self._more.wait()

    def _next_batch(self) -> list[dict[str, Any]]:
        with self._lock:
            n = min(MAX_BATCH, len(self._queue))
            batch = [self._queue.popleft() for _ in range(n)]
            QUEUE_LENGTH.set(len(self._queue))
        return batch

    async def _send_all(self, session: Any, batch: list[dict[str, Any]]) -> None:
        with self._lock:
            sets = list(self.config.sets)
        jobs = []
        for s in sets:
            alerts = batch
            if s.alert_relabel:
                alerts = []
                for a in batch:
                    lset = relabel(a["labels"], s.alert_relabel)
                    if lset:
                        alerts.append({**a, "labels": lset})
            if not alerts:
                continue
            body = json.dumps(alerts).encode()
            jobs += [self._post(session, s, url, body, len(alerts)) for url in s.urls]
        if jobs:
            await asyncio.gather(*jobs)

    async def _post(self, session: Any, s: AlertmanagerSet, url: str, body: bytes, n: int) -> None:
        import aiohttp

        last = ""
        for attempt in range(len(RETRY_DELAYS_S) + 1):
            try:
                async with session.post(url, data=body, headers=s.headers(), ssl=s.http.ssl_context(),
                                        server_hostname=s.http.server_hostname(), proxy=s.http.proxy_url,
                                        allow_redirects=s.http.follow_redirects,
                                        timeout=aiohttp.ClientTimeout(total=s.timeout_s)) as resp:
                    if resp.status // 100 == 2:
                        SENT.labels(url).inc(n)
                        return
                    last = f"bad response status {resp.status}: {(await resp.text())[:200]}"
                    if resp.status // 100 == 4:
                        break  # Alertmanager refused the payload: resending it cannot help
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
                last = f"{type(e).__name__}: {e}"
            if attempt < len(RETRY_DELAYS_S) and not self._stopping and len(self._queue) < self.capacity:
                await asyncio.sleep(RETRY_DELAYS_S[attempt])
            else:
                break
        ERRORS.labels(url).inc(n)
        log.error("error sending %d alerts to Alertmanager %s: %s", n, url, last)
