"""`make demo`: the server with its embedded store, scraping itself, plus the demo workload.

Writes a Prometheus-style config into the data dir (a scrape job for the server's own /metrics),
starts `turboprom serve` in this process, and prints what to open and query.
"""
from __future__ import annotations

import argparse
import asyncio
import logging
from pathlib import Path

import yaml

from turboprom.config import ServerConfig

DEMO_SCRAPE_INTERVAL = "5s"


def demo_config(listen: str) -> dict:
    return {
        "global": {"scrape_interval": DEMO_SCRAPE_INTERVAL, "evaluation_interval": "15s"},
        "scrape_configs": [
            {
                "job_name": "turboprom",
                "static_configs": [{"targets": [listen]}],
            }
        ],
    }


def banner(listen: str, data_dir: str) -> str:
    base = f"http://{listen}"
    return f"""
TurboProm demo is starting (data dir {data_dir}).

  Open:      {base}/
  Health:    curl -s {base}/-/ready
  Query:     curl -s '{base}/api/v1/query?query=up'
             curl -s '{base}/api/v1/query_range?query=rate(turboprom_http_requests_total[1m])&start='$(($(date +%s)-600))'&end='$(date +%s)'&step=15'
  promtool:  promtool query instant {base} 'up'
  Grafana:   add a Prometheus datasource with URL {base}

Stop with Ctrl-C (the head is persisted on shutdown).
"""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="turboprom-demo")
    ap.add_argument("--data-dir", default="./data")
    ap.add_argument("--listen", default="127.0.0.1:9090")
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    Path(a.data_dir).mkdir(parents=True, exist_ok=True)
    cfg_path = Path(a.data_dir) / "demo-config.yml"
    cfg_path.write_text(yaml.safe_dump(demo_config(a.listen), sort_keys=False))
    cfg = ServerConfig(data_dir=a.data_dir, listen=a.listen, config_file=str(cfg_path))
    cfg.load_file()
    print(banner(a.listen, a.data_dir), flush=True)
    from turboprom.server import serve

    asyncio.run(serve(cfg))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
