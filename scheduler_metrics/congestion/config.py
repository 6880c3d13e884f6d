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
    ca2: float = 1.0
    cs2: float = 1.0
    rho_max: float = 0.98
    default_tokens_per_request: float = 1024.0  # until a worker's own ratio is measured
    max_cache_entries: int = 2_000_000  # label-set -> slot cache bound (irrelevant series included)

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any] | None) -> "CongestionConfig":
        cfg = cls()
        if not raw:
            return cfg
        if not isinstance(raw, Mapping):
            raise ValueError("congestion: must be a mapping")
        aliases = {"stale_after": "stale_after_s", "drop_after": "drop_after_s", "rate_window": "rate_window_s",
                   "resolution": "resolution_s", "rebuild_period": "rebuild_period_s",
                   "rebuild_min_interval": "rebuild_min_interval_s"}
        known = {f.name: f for f in fields(cls)}
        for key, value in raw.items():
            name = aliases.get(key, key)
            if name not in known:
                raise ValueError(f"congestion: unknown setting {key!r} (known: {', '.join(sorted(known))})")
            if name.endswith("_s"):
                setattr(cfg, name, parse_seconds(value, key))
            elif isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or (name == "max_cache_entries" and not isinstance(value, int)):
                raise ValueError(f"congestion.{key}: expected {'an integer' if name == 'max_cache_entries' else 'a number'}, got {value!r}")
            elif name == "max_cache_entries":
                setattr(cfg, name, int(value))
            else:
                setattr(cfg, name, float(value))
        if cfg.drop_after_s < cfg.stale_after_s:
            raise ValueError("congestion: drop_after must be >= stale_after")
        if cfg.rate_window_s <= 0:
            raise ValueError("congestion: rate_window must be > 0")
        return cfg
