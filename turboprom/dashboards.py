"""Grafana dashboards, defined once: docs/grafana/*.json is generated from here, the demo's
recurring dashboard workload replays these same panel queries, and a test checks each returns data.

    .venv/bin/python -m turboprom.dashboards --write docs/grafana
"""
from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Panel:
    title: str
    expr: str
    unit: str = "short"
    legend: str = ""


@dataclass(frozen=True)
class Dashboard:
    uid: str
    title: str
    panels: tuple[Panel, ...]


SCHEDULING = Dashboard("turboprom-scheduling", "LLM serving: scheduling telemetry", (
    Panel("TTFT p99", 'histogram_quantile(0.99, sum by (le) (rate(vllm:time_to_first_token_seconds_bucket[1m])))', "s", "p99"),
    Panel("TTFT p50", 'histogram_quantile(0.5, sum by (le) (rate(vllm:time_to_first_token_seconds_bucket[1m])))', "s", "p50"),
    Panel("Mean TTFT by instance", 'sum by (instance) (rate(vllm:time_to_first_token_seconds_sum[1m])) / sum by (instance) (rate(vllm:time_to_first_token_seconds_count[1m]))', "s", "{{instance}}"),
    Panel("Requests waiting", 'sum by (instance) (vllm:num_requests_waiting)', "short", "{{instance}}"),
    Panel("Prefill backlog (tokens)", 'sum by (instance) (turboprom_worker_prefill_backlog_tokens)', "short", "{{instance}}"),
    Panel("Congestion price per instance", 'turboprom_congestion_price_seconds_per_token', "s", "{{instance}}"),
    Panel("Cluster utilization", 'turboprom_congestion_cluster_utilization_ratio', "percentunit", "{{cluster}}"),
    Panel("KV cache usage", 'avg by (instance) (vllm:kv_cache_usage_perc)', "percentunit", "{{instance}}"),
    Panel("Generation throughput", 'sum(rate(vllm:generation_tokens_total[1m]))', "short", "tokens/s"),
    Panel("Prefill tokens computed", 'sum by (instance) (rate(turboprom_worker_prefill_computed_tokens_total[1m]))', "short", "{{instance}}"),
    Panel("Assignments by executor", 'sum by (executor) (rate(turboprom_scheduler_assignments_total[1m]))', "reqps", "{{executor}}"),
    Panel("KV moved", 'sum(rate(turboprom_worker_kv_transfer_bytes_total[1m])) + sum(rate(turboprom_worker_kv_writeback_bytes_total[1m]))', "Bps", "bytes/s"),
))

TURBOPROM = Dashboard("turboprom-self", "TurboProm itself", (
    Panel("Samples ingested", 'sum(rate(turboprom_storage_appended_samples_total[1m]))', "short", "samples/s"),
    Panel("Ingest rejections by reason", 'sum by (reason) (rate(turboprom_storage_rejected_samples_total[5m]))', "short", "{{reason}}"),
    Panel("Head series", 'turboprom_storage_head_series', "short", "series"),
    Panel("WAL fsync p99", 'histogram_quantile(0.99, sum by (le) (rate(turboprom_storage_wal_fsync_seconds_bucket[5m])))', "s", "p99"),
    Panel("HTTP request rate by route", 'sum by (handler) (rate(turboprom_http_requests_total[1m]))', "reqps", "{{handler}}"),
    Panel("Query latency p99", 'histogram_quantile(0.99, sum by (le) (rate(turboprom_http_request_duration_seconds_bucket{handler=~"/api/v1/query.*"}[5m])))', "s", "p99"),
    Panel("Queries by serving path", 'sum by (path) (rate(turboprom_queries_total[5m]))', "reqps", "{{path}}"),
    Panel("Query CPU p99 by path", 'histogram_quantile(0.99, sum by (le, path) (rate(turboprom_query_cpu_seconds_bucket[5m])))', "s", "{{path}}"),
    Panel("Congestion API latency p99", 'histogram_quantile(0.99, sum by (le) (rate(turboprom_http_request_duration_seconds_bucket{handler="/api/v1/congestion"}[5m])))', "s", "p99"),
    Panel("Scrapes", 'sum by (job) (up)', "short", "{{job}}"),
    Panel("Process memory", 'process_resident_memory_bytes{job="turboprom"}', "bytes", "RSS"),
))

DASHBOARDS = (SCHEDULING, TURBOPROM)


def grafana_json(d: Dashboard) -> dict:
    panels = []
    for i, p in enumerate(d.panels):
        panels.append({
            "id": i + 1, "type": "timeseries", "title": p.title,
            "datasource": {"type": "prometheus", "uid": "${DS_PROMETHEUS}"},
            "gridPos": {"h": 8, "w": 12, "x": 12 * (i % 2), "y": 8 * (i // 2)},
            "fieldConfig": {"defaults": {"unit": p.unit}, "overrides": []},
            "options": {"legend": {"displayMode": "list", "placement": "bottom"}, "tooltip": {"mode": "multi"}},
            "targets": [{"refId": "A", "expr": p.expr, "legendFormat": p.legend, "range": True,
                         "datasource": {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}}],
        })
    return {
        "__inputs": [{"name": "DS_PROMETHEUS", "label": "TurboProm", "type": "datasource", "pluginId": "prometheus", "pluginName": "Prometheus"}],
        "uid": d.uid, "title": d.title, "schemaVersion": 39, "version": 1, "editable": True,
        "time": {"from": "now-1h", "to": "now"}, "refresh": "10s", "tags": ["turboprom"],
        "templating": {"list": []}, "panels": panels,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--write", default="docs/grafana")
    out = Path(ap.parse_args().write)
    out.mkdir(parents=True, exist_ok=True)
    for d in DASHBOARDS:
        (out / f"{d.uid}.json").write_text(json.dumps(grafana_json(d), indent=2) + "\n")
        print(f"wrote {out / (d.uid + '.json')}")


if __name__ == "__main__":
    main()
