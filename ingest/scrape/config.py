"""`scrape_configs` (and `global`) from the server's YAML config, with Prometheus defaults."""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from ingest.http_client_config import HTTP_CLIENT_FIELDS, HTTPClientConfig
from ingest.relabel import RelabelConfig, parse_relabel_configs

_DUR = re.compile(r"(\d+)(ms|y|w|d|h|m|s)")
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 604_800_000, "y": 31_536_000_000}


class ScrapeConfigError(ValueError):
    pass


def parse_duration_ms(text: Any) -> int:
    """Prometheus duration ('15s', '1m30s', '500ms', '1d'); plain numbers are seconds."""
    if isinstance(text, (int, float)):
        return int(text * 1000)
    s = str(text).strip()
    if s == "0":
        return 0
    pos, total = 0, 0
    for m in _DUR.finditer(s):
        if m.start() != pos:
            break
        total += int(m.group(1)) * _UNIT_MS[m.group(2)]
        pos = m.end()
    if pos != len(s) or not s:
        raise ScrapeConfigError(f"not a valid duration string: {text!r}")
    return total


def parse_size(text: Any) -> int:
    """Prometheus byte sizes: 0, 1024, '10MB', '512KiB', '1GB' (binary units, as Prometheus uses)."""
    if isinstance(text, (int, float)):
        return int(text)
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGTPE]?)(i?B)?\s*", str(text), re.I)
    if not m:
        raise ScrapeConfigError(f"not a valid size: {text!r}")
    return int(float(m.group(1)) * 1024 ** " KMGTPE".index((m.group(2) or " ").upper()))


def format_duration(ms: int) -> str:
    if ms == 0:
        return "0s"
    out = ""
    for unit in ("y", "w", "d", "h", "m", "s", "ms"):
        u = _UNIT_MS[unit]
        if ms >= u:
            out += f"{ms // u}{unit}"
            ms %= u
    return out


# Known fields of the server YAML sections read here (checked by turboprom/config.py; see its docstring
# for the notation). evaluation_interval is read by planner/rules.py, metric_name_validation_scheme by
# turboprom/wiring.py (ingest/validation.py).
GLOBAL_FIELDS: dict[str, Any] = {
    "scrape_interval": "duration", "scrape_timeout": "duration", "evaluation_interval": "duration",
    "metric_name_validation_scheme": ("=utf8", "=legacy"),
}
RELABEL_FIELDS: dict[str, Any] = {  # ingest/relabel.py RelabelConfig.from_dict
    "action": "str", "source_labels": ["str"], "separator": "str", "regex": "str", "target_label": "str",
    "replacement": "str", "modulus": "int",
}
SCRAPE_CONFIG_FIELDS: dict[str, Any] = {
    "job_name": "str", "scrape_interval": "duration", "scrape_timeout": "duration", "metrics_path": "str",
    "scheme": ("=http", "=https"), "params": {"*": ("str", ["str"])}, "honor_labels": "bool", "honor_timestamps": "bool",
    "static_configs": [{"targets": ["str"], "labels": {"*": "str"}}],
    "file_sd_configs": [{"files": ["str"], "refresh_interval": "duration"}],
    "relabel_configs": [RELABEL_FIELDS], "metric_relabel_configs": [RELABEL_FIELDS],
    "body_size_limit": "size", "sample_limit": "int",
    **HTTP_CLIENT_FIELDS,  # basic_auth, authorization, tls_config, proxy_url, ... (ingest/http_client_config.py)
}


@dataclass
class FileSDConfig:
    files: list[str]
    refresh_interval_ms: int = 300_000


@dataclass
class ScrapeConfig:
    job_name: str
    scrape_interval_ms: int = 60_000
    scrape_timeout_ms: int = 10_000
    metrics_path: str = "/metrics"
    scheme: str = "http"
    params: dict[str, list[str]] = field(default_factory=dict)
    honor_labels: bool = False
    honor_timestamps: bool = True
    static_configs: list[dict[str, Any]] = field(default_factory=list)  # [{"targets": [...], "labels": {...}}]
    file_sd_configs: list[FileSDConfig] = field(default_factory=list)
    relabel_configs: list[RelabelConfig] = field(default_factory=list)
    metric_relabel_configs: list[RelabelConfig] = field(default_factory=list)
    body_size_limit: int = 0
    sample_limit: int = 0
    http: HTTPClientConfig = field(default_factory=HTTPClientConfig)  # auth, TLS, proxy, redirects


def parse_scrape_configs(raw: dict[str, Any], base_dir: str | None = None) -> list[ScrapeConfig]:
    """``base_dir``: the config file's folder (credential and TLS files are relative to it)."""
    glob = raw.get("global") or {}
    g_interval = parse_duration_ms(glob.get("scrape_interval", "1m"))
    g_timeout = parse_duration_ms(glob.get("scrape_timeout", "10s"))
    out: list[ScrapeConfig] = []
    seen: set[str] = set()
    for i, d in enumerate(raw.get("scrape_configs") or []):
        if not isinstance(d, dict) or not d.get("job_name"):
            raise ScrapeConfigError(f"scrape_configs[{i}]: job_name is required")
        job = str(d["job_name"])
        if job in seen:
            raise ScrapeConfigError(f"found multiple scrape configs with job name {job!r}")
        seen.add(job)
        interval = parse_duration_ms(d.get("scrape_interval", g_interval / 1000))
        timeout = parse_duration_ms(d["scrape_timeout"]) if "scrape_timeout" in d else min(g_timeout, interval)
        if timeout > interval:
            raise ScrapeConfigError(f"job {job!r}: scrape timeout greater than scrape interval")
        scheme = str(d.get("scheme", "http"))
        if scheme not in ("http", "https"):
            raise ScrapeConfigError(f"job {job!r}: unsupported scheme {scheme!r}")
        params = {str(k): [str(x) for x in (v if isinstance(v, list) else [v])] for k, v in (d.get("params") or {}).items()}
        static = []
        for sc in d.get("static_configs") or []:
            static.append({"targets": [str(t) for t in sc.get("targets") or []],
                           "labels": {str(k): str(v) for k, v in (sc.get("labels") or {}).items()}})
        fsd = []
        for f in d.get("file_sd_configs") or []:
            files = f.get("files") or []
            if not files:
                raise ScrapeConfigError(f"job {job!r}: file_sd_configs needs files")
            fsd.append(FileSDConfig([str(x) for x in files], parse_duration_ms(f.get("refresh_interval", "5m"))))
        try:
            rc = parse_relabel_configs(d.get("relabel_configs"))
            mrc = parse_relabel_configs(d.get("metric_relabel_configs"))
        except ValueError as e:
            raise ScrapeConfigError(f"job {job!r}: {e}") from None
        try:
            http = HTTPClientConfig.parse(d, f"scrape_configs[{i}]", base_dir)
        except ValueError as e:
            raise ScrapeConfigError(str(e)) from None
        out.append(ScrapeConfig(job, interval, timeout, str(d.get("metrics_path", "/metrics")), scheme, params,
                                bool(d.get("honor_labels", False)), bool(d.get("honor_timestamps", True)),
                                static, fsd, rc, mrc, parse_size(d.get("body_size_limit", 0) or 0), int(d.get("sample_limit", 0) or 0),
                                http))
    return out
