"""Congestion tracker settings (YAML section ``congestion:`` of the server config)."""
from __future__ import annotations

import re
from dataclasses import dataclass, fields
from typing import Any, Mapping

_DUR = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


def parse_seconds(value: Any, what: str) -> float:
    """Seconds from a number or a simple duration string (``250ms``, ``2s``, ``5m``)."""
    if isinstance(value, bool):
        raise ValueError(f"congestion.{what}: expected seconds or a duration like '2s', got {value!r}")
    if isinstance(value, (int, float)):
        return float(value)
    m = _DUR.match(str(value))
    if not m:
        raise ValueError(f"congestion.{what}: expected seconds or a duration like '2s', got {value!r}")
    return float(m.group(1)) * _UNIT_S[m.group(2)]


@dataclass
class CongestionConfig:
    stale_after_s: float = 15.0  # newest sample older than this: instance marked stale
    drop_after_s: float = 300.0  # ... older than this: instance forgotten
    rate_window_s: float = 5.0  # EWMA time constant for counter rates and backlog growth
    resolution_s: float = 5.0  # write-back period of turboprom_congestion_* series (0 = off)
    rebuild_min_interval_s: float = 0.01  # coalesce snapshot rebuilds under heavy ingest
    rebuild_period_s: float = 0.5  # rebuild at least this often (ages, staleness) even without data
    idle_after_s: float = 30.0  # no reader for this long: rebuild only every idle_rebuild_period_s (0 = never idle)
    idle_rebuild_period_s: float = 5.0  # rebuild period while nobody reads (the write-back still gets fresh signals)
    ca2: float = 1.0
    cs2: float = 1.0
    rho_max: float = 0.98
    default_tokens_per_request: float = 1024.0  # until a worker's own ratio is measured
    max_cache_entries: int = 2_000_000  # label-set -> slot cache bound (irrelevant series included)
    stream_interval_s: float = 0.0  # default SSE pacing (0 = an event per snapshot); ?interval= overrides
    fast_scrape_interval_s: float = 0.0  # fast signal scrape of fast_scrape_jobs (0 = off; 0.05-0.25 s)
    fast_scrape_jobs: tuple[str, ...] = ()  # scrape_configs job names whose targets get the fast scrape
    kv_events: tuple[dict[str, str], ...] = ()  # vLLM KV event publishers: endpoint, instance, cluster, model_name, topic, replay_endpoint
    kv_max_blocks_per_instance: int = 1_000_000
    poll_listen: str = ""  # host:port of the poll endpoint's own process ("" = off; port 0 = any)

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any] | None) -> "CongestionConfig":
        cfg = cls()
        if not raw:
            return cfg
        if not isinstance(raw, Mapping):
            raise ValueError("congestion: must be a mapping")
        aliases = {"stale_after": "stale_after_s", "drop_after": "drop_after_s", "rate_window": "rate_window_s",
                   "resolution": "resolution_s", "rebuild_period": "rebuild_period_s",
                   "rebuild_min_interval": "rebuild_min_interval_s", "idle_after": "idle_after_s",
                   "idle_rebuild_period": "idle_rebuild_period_s"}
        aliases.update({"stream_interval": "stream_interval_s", "fast_scrape_interval": "fast_scrape_interval_s"})
        known = {f.name: f for f in fields(cls)}
        for key, value in raw.items():
            name = aliases.get(key, key)
            if name not in known:
                raise ValueError(f"congestion: unknown setting {key!r} (known: {', '.join(sorted(known))})")
            if name == "fast_scrape_jobs":
                if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
                    raise ValueError(f"congestion.fast_scrape_jobs: expected a list of job names, got {value!r}")
                cfg.fast_scrape_jobs = tuple(value)
            elif name == "kv_events":
                cfg.kv_events = _kv_endpoints(value)
            elif name == "poll_listen":
                host, sep, port = str(value).rpartition(":")
                if not isinstance(value, str) or (value and (not sep or not port.isdigit() or int(port) > 65535)):
                    raise ValueError(f"congestion.poll_listen: expected host:port like 127.0.0.1:9091, got {value!r}")
                cfg.poll_listen = value
            elif name.endswith("_s"):
                setattr(cfg, name, parse_seconds(value, key))
            elif isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or (name in _INT_FIELDS and not isinstance(value, int)):
                raise ValueError(f"congestion.{key}: expected {'an integer' if name in _INT_FIELDS else 'a number'}, got {value!r}")
            elif name in _INT_FIELDS:
                setattr(cfg, name, int(value))
            else:
                setattr(cfg, name, float(value))
        if cfg.drop_after_s < cfg.stale_after_s:
            raise ValueError("congestion: drop_after must be >= stale_after")
        if cfg.rate_window_s <= 0:
            raise ValueError("congestion: rate_window must be > 0")
        if cfg.fast_scrape_interval_s and not 0.05 <= cfg.fast_scrape_interval_s <= 0.25:
            raise ValueError("congestion: fast_scrape_interval must be 0 (off) or between 50ms and 250ms, "
                             f"got {cfg.fast_scrape_interval_s:g}s")
        if cfg.fast_scrape_jobs and not cfg.fast_scrape_interval_s:
            raise ValueError("congestion: fast_scrape_jobs needs fast_scrape_interval (50ms-250ms)")
        if cfg.idle_after_s < 0:
            raise ValueError("congestion: idle_after must be >= 0 (0: never idle)")
        if cfg.idle_rebuild_period_s <= 0:
            raise ValueError("congestion: idle_rebuild_period must be > 0")
        if cfg.stream_interval_s < 0:
            raise ValueError("congestion: stream_interval must be >= 0")
        return cfg


_INT_FIELDS = ("max_cache_entries", "kv_max_blocks_per_instance")
_KV_KEYS = ("endpoint", "instance", "cluster", "model_name", "topic", "replay_endpoint")


def _kv_endpoints(value: Any) -> tuple[dict[str, str], ...]:
    """``kv_events:`` entries, each the ZMQ endpoint of one engine's publisher and that engine's labels."""
    if not isinstance(value, list):
        raise ValueError(f"congestion.kv_events: expected a list of publishers, got {value!r}")
    out = []
    for i, ent in enumerate(value):
        if not isinstance(ent, Mapping):
            raise ValueError(f"congestion.kv_events[{i}]: expected a mapping, got {ent!r}")
        unknown = sorted(set(ent) - set(_KV_KEYS))
        if unknown:
            raise ValueError(f"congestion.kv_events[{i}]: unknown key(s) {', '.join(unknown)} (known: {', '.join(_KV_KEYS)})")
        for k in ("endpoint", "instance"):
            if not isinstance(ent.get(k), str) or not ent[k]:
                raise ValueError(f"congestion.kv_events[{i}]: {k} is required (a non-empty string)")
        for k, example in (("endpoint", "tcp://host:5557"), ("replay_endpoint", "tcp://host:5558")):
            if k in ent and not str(ent[k]).startswith(("tcp://", "ipc://", "inproc://")):
                raise ValueError(f"congestion.kv_events[{i}]: {k} must be a ZMQ address like {example}, got {ent[k]!r}")
        bad = [k for k in _KV_KEYS if k in ent and not isinstance(ent[k], str)]
        if bad:
            raise ValueError(f"congestion.kv_events[{i}]: {', '.join(bad)} must be strings")
        out.append({k: str(ent.get(k, "")) for k in _KV_KEYS})
    return tuple(out)
