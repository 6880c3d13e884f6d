"""The wired-together server: one object the route modules receive."""
from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from turboprom.config import ServerConfig


@dataclass
class ServerContext:
    config: ServerConfig
    storage: Any  # storage.tsdb.TSDB
    started_at: float = field(default_factory=time.time)
    # Heavy work (queries, block writes) runs here, never on the event loop.
    executor: ThreadPoolExecutor = field(default_factory=lambda: ThreadPoolExecutor(max_workers=4, thread_name_prefix="turboprom-work"))
    # Filled in by wiring as stages land: ingest pipeline, engine, scraper, tracker, planner, ...
    components: dict[str, Any] = field(default_factory=dict)
    ready: bool = False
