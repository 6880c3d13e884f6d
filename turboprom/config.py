"""Server configuration: command-line flags plus an optional Prometheus-style YAML file."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from storage.options import StorageOptions


@dataclass
class ServerConfig:
    data_dir: str = "./data"
    listen: str = "127.0.0.1:9090"
    config_file: str | None = None
    storage: StorageOptions = field(default_factory=StorageOptions)
    # Raw YAML (scrape_configs, rule_files, global, ...); sections are interpreted by their stage.
    raw: dict[str, Any] = field(default_factory=dict)
    lookback_delta_ms: int = 300_000
    query_timeout_s: float = 120.0
    query_max_samples: int = 50_000_000
    query_max_depth: int = 256  # deepest expression tree accepted (promql/query_guard.py); 0 = no limit
    query_max_memory_bytes: int = 2 * 1024**3  # per-query memory estimate budget; 0 = no limit
    max_body_bytes: int = 32 * 1024 * 1024
    self_scrape_interval_s: float = 15.0
    web_config_file: str | None = None  # auth + TLS (turboprom.auth)
    insecure: bool = False  # allow a non-loopback listen address without auth

    @property
    def host(self) -> str:
        return self.listen.rsplit(":", 1)[0].strip("[]") or "127.0.0.1"

    @property
    def port(self) -> int:
        return int(self.listen.rsplit(":", 1)[1])

    def load_file(self) -> None:
        if not self.config_file:
            return
        text = Path(self.config_file).read_text()
        data = yaml.safe_load(text) or {}
        if not isinstance(data, dict):
            raise ValueError(f"config file {self.config_file}: top level must be a mapping")
        self.raw = data
