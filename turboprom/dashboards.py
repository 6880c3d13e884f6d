"""Grafana dashboards, defined once: docs/grafana/*.json is generated from here, the demo's
recurring dashboard workload replays these same panel queries, and a test checks each returns data.

    .venv/bin/python -m turboprom.dashboards --write docs/grafana

Panel queries are written as Grafana sends them before interpolation: ``$__rate_interval`` for
rate windows and ``$cluster``/``$model_name``/``$instance`` template variables (multi-value, "All"
meaning ``.*``). ``Panel.queries`` expands them the way Grafana does with every variable at "All"
and the datasource's scrape interval, so the demo workload and the tests send the very text a
Grafana refresh would. Datasources are a ``datasource`` template variable (no ``__inputs``), so file
provisioning and UI import both resolve them.
"""
from __future__ import annotations

import argparse
import json
import re
from dataclasses import dataclass
from pathlib import Path

# The variables a vLLM selector is filtered by, and the selector text every vLLM query carries.
FLEET_VARIABLES = ("cluster", "model_name", "instance")
FLEET = '{cluster=~"$cluster", model_name=~"$model_name", instance=~"$instance"}'
CLUSTER = '{cluster=~"$cluster"}'
# Grafana's $__rate_interval: max(4 x scrape interval, step + scrape interval); for the bundled
# dashboards' 1h range (15 s steps) and a 15 s scrape interval that is 1m.
DEFAULT_RATE_INTERVAL = "1m"


@dataclass(frozen=True)
class Target:
    expr: str
    legend: str = ""


@dataclass(frozen=True)
class Panel:
    title: str
    targets: tuple[Target, ...]
    unit: str = "short"
    stacked: bool = False

    def queries(self, rate_interval: str = DEFAULT_RATE_INTERVAL) -> list[str]:
        """The PromQL Grafana sends for this panel with every template variable at "All"."""
        return [expand(t.expr, rate_interval=rate_interval) for t in self.targets]


@dataclass(frozen=True)
class Dashboard:
    uid: str
    title: str
    panels: tuple[Panel, ...]
    variables: tuple[str, ...] = ()  # template variables besides ``datasource`` (of FLEET_VARIABLES)


_VARIABLE = re.compile(r"\$(\w+)|\$\{(\w+)\}")


def expand(expr: str, *, rate_interval: str = DEFAULT_RATE_INTERVAL, values: dict[str, str] | None = None) -> str:
    """Interpolate Grafana variables: ``$__rate_interval``, and template variables (regex values, "All" = ``.*``)."""
    vals = {"__rate_interval": rate_interval, **{v: ".*" for v in FLEET_VARIABLES}, **(values or {})}

    def sub(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2)
        if name not in vals:
            raise KeyError(f"unknown Grafana variable ${name} in {expr!r}")
        return vals[name]
    return _VARIABLE.sub(sub, expr)


def variables_in(expr: str) -> set[str]:
    return {m.group(1) or m.group(2) for m in _VARIABLE.finditer(expr)}


def _quantiles(metric: str, qs: tuple[float, ...] = (0.5, 0.9, 0.99), by: str = "model_name") -> tuple[Target, ...]:
    return tuple(Target(f"histogram_quantile({q}, sum by (le, {by}) (rate({metric}_bucket{FLEET}[$__rate_interval])))",
                        f"p{round(q * 100)} {{{{{by}}}}}") for q in qs)


def _rate(metric: str, by: str, sel: str = FLEET) -> str:
    return f"sum by ({by}) (rate({metric}{sel}[$__rate_interval]))"


VLLM = Dashboard("turboprom-vllm", "LLM serving: vLLM fleet", (
    Panel("Time to first token", _quantiles("vllm:time_to_first_token_seconds"), "s"),
    Panel("Inter-token latency", _quantiles("vllm:inter_token_latency_seconds"), "s"),
    Panel("End-to-end request latency", _quantiles("vllm:e2e_request_latency_seconds"), "s"),
    Panel("Queue time", _quantiles("vllm:request_queue_time_seconds"), "s"),
    Panel("Prefill time", _quantiles("vllm:request_prefill_time_seconds"), "s"),
    Panel("Finished requests by reason", (Target(_rate("vllm:request_success_total", "finished_reason"), "{{finished_reason}}"),),
          "reqps", stacked=True),
    Panel("Token throughput", (Target(_rate("vllm:prompt_tokens_total", "model_name"), "prompt {{model_name}}"),
                               Target(_rate("vllm:generation_tokens_total", "model_name"), "generation {{model_name}}")), "short"),
    Panel("KV-cache usage", (Target(f"avg by (instance) (vllm:kv_cache_usage_perc{FLEET})", "{{instance}}"),), "percentunit"),
    Panel("Prefix-cache hit rate", (Target(f'{_rate("vllm:prefix_cache_hits_total", "model_name")} / '
                                           f'{_rate("vllm:prefix_cache_queries_total", "model_name")}', "{{model_name}}"),), "percentunit"),
    Panel("Preemptions", (Target(_rate("vllm:num_preemptions_total", "instance"), "{{instance}}"),), "short", stacked=True),
    Panel("Requests running and waiting", (Target(f"sum by (model_name) (vllm:num_requests_running{FLEET})", "running {{model_name}}"),
                                           Target(f"sum by (model_name) (vllm:num_requests_waiting{FLEET})", "waiting {{model_name}}")), "short"),
    Panel("Mean prompt length", (Target(f'{_rate("vllm:request_prompt_tokens_sum", "model_name")} / '
                                        f'{_rate("vllm:request_prompt_tokens_count", "model_name")}', "{{model_name}}"),), "short"),
    # service-level row: the same signals over trailing hours, as SLO and capacity reviews read them
    Panel("TTFT p99, trailing hour (SLO)", (Target(
        f"histogram_quantile(0.99, sum by (le, model_name) (rate(vllm:time_to_first_token_seconds_bucket{FLEET}[1h])))",
        "p99 {{model_name}}"),), "s"),
    Panel("End-to-end latency p99, trailing hour (SLO)", (Target(
        f"histogram_quantile(0.99, sum by (le, model_name) (rate(vllm:e2e_request_latency_seconds_bucket{FLEET}[1h])))",
        "p99 {{model_name}}"),), "s"),
    Panel("Finished requests, trailing hour", (Target(
        f"sum by (model_name) (increase(vllm:request_success_total{FLEET}[1h]))", "{{model_name}}"),), "short"),
    Panel("Peak KV-cache usage, trailing hour", (Target(
        f"max by (instance) (max_over_time(vllm:kv_cache_usage_perc{FLEET}[1h]))", "{{instance}}"),), "percentunit"),
    Panel("Mean waiting requests, trailing hour", (Target(
        f"avg by (model_name) (avg_over_time(vllm:num_requests_waiting{FLEET}[1h]))", "{{model_name}}"),), "short"),
), FLEET_VARIABLES)

SCHEDULING = Dashboard("turboprom-scheduling", "LLM serving: scheduling telemetry", (
    Panel("TTFT p99 and p50", _quantiles("vllm:time_to_first_token_seconds", (0.99, 0.5)), "s"),
    Panel("Mean TTFT by instance", (Target(f'{_rate("vllm:time_to_first_token_seconds_sum", "instance")} / '
                                           f'{_rate("vllm:time_to_first_token_seconds_count", "instance")}', "{{instance}}"),), "s"),
    Panel("Requests waiting", (Target(f"sum by (instance) (vllm:num_requests_waiting{FLEET})", "{{instance}}"),), "short", stacked=True),
    Panel("Prefill backlog (tokens)", (Target(f"sum by (instance) (turboprom_worker_prefill_backlog_tokens{FLEET})", "{{instance}}"),),
          "short", stacked=True),
    Panel("Congestion price per instance", (Target(f"turboprom_congestion_price_seconds_per_token{FLEET}", "{{instance}}"),), "s"),
    Panel("Cluster utilization", (Target(f"turboprom_congestion_cluster_utilization_ratio{CLUSTER}", "{{cluster}}"),), "percentunit"),
    Panel("KV-cache usage", (Target(f"avg by (instance) (vllm:kv_cache_usage_perc{FLEET})", "{{instance}}"),), "percentunit"),
    Panel("Generation throughput", (Target(f'sum(rate(vllm:generation_tokens_total{FLEET}[$__rate_interval]))', "tokens/s"),), "short"),
    Panel("Prefill tokens computed", (Target(_rate("turboprom_worker_prefill_computed_tokens_total", "instance"), "{{instance}}"),),
          "short", stacked=True),
    Panel("Assignments by executor", (Target(_rate("turboprom_scheduler_assignments_total", "executor", CLUSTER), "{{executor}}"),),
          "reqps", stacked=True),
    Panel("KV moved", (Target(f'sum(rate(turboprom_worker_kv_transfer_bytes_total{FLEET}[$__rate_interval])) + '
                              f'sum(rate(turboprom_worker_kv_writeback_bytes_total{FLEET}[$__rate_interval]))', "bytes/s"),), "Bps"),
    Panel("Queue time p99", _quantiles("vllm:request_queue_time_seconds", (0.99,), by="instance"), "s"),
    # what the scheduler asked KedgeFlow for (docs/kedgeflow.md, "In the demo"); the audit log holds each step
    Panel("KedgeFlow actions by outcome", (Target(_rate("turboprom_scheduler_control_actions_total", "verb, outcome", CLUSTER),
                                                  "{{verb}} {{outcome}}"),), "ops", stacked=True),
), FLEET_VARIABLES)

TURBOPROM = Dashboard("turboprom-self", "TurboProm itself", (
    Panel("Samples ingested", (Target('sum(rate(turboprom_storage_appended_samples_total[$__rate_interval]))', "samples/s"),), "short"),
    Panel("Ingest rejections by reason", (Target('sum by (reason) (rate(turboprom_storage_rejected_samples_total[$__rate_interval]))', "{{reason}}"),),
          "short", stacked=True),
    Panel("Head series", (Target('turboprom_storage_head_series', "series"),), "short"),
    Panel("WAL fsync p99", (Target('histogram_quantile(0.99, sum by (le) (rate(turboprom_storage_wal_fsync_seconds_bucket[$__rate_interval])))', "p99"),), "s"),
    Panel("HTTP request rate by route", (Target('sum by (handler) (rate(turboprom_http_requests_total[$__rate_interval]))', "{{handler}}"),),
          "reqps", stacked=True),
    Panel("Query latency p99", (Target('histogram_quantile(0.99, sum by (le) (rate(turboprom_http_request_duration_seconds_bucket'
                                       '{handler=~"/api/v1/query.*"}[$__rate_interval])))', "p99"),), "s"),
    Panel("Queries by serving path", (Target('sum by (path) (rate(turboprom_queries_total[$__rate_interval]))', "{{path}}"),), "reqps", stacked=True),
    Panel("Query CPU p99 by path", (Target('histogram_quantile(0.99, sum by (le, path) (rate(turboprom_query_cpu_seconds_bucket[$__rate_interval])))',
                                           "{{path}}"),), "s"),
    Panel("Congestion API latency p99", (Target('histogram_quantile(0.99, sum by (le) (rate(turboprom_http_request_duration_seconds_bucket'
                                                '{handler="/api/v1/congestion"}[$__rate_interval])))', "p99"),), "s"),
    Panel("Scrape targets up", (Target('sum by (job) (up)', "{{job}}"),), "short"),
    Panel("Process memory", (Target('process_resident_memory_bytes{job="turboprom"}', "RSS"),), "bytes"),
))

DASHBOARDS = (VLLM, SCHEDULING, TURBOPROM)

_DS = {"type": "prometheus", "uid": "${datasource}"}


def _variables(d: Dashboard) -> list[dict]:
    out: list[dict] = [{"name": "datasource", "label": "Data source", "type": "datasource", "query": "prometheus",
                        "current": {}, "hide": 0, "refresh": 1, "regex": "", "options": []}]
    filters: list[str] = []
    for name in d.variables:
        sel = "{" + ", ".join(filters) + "}" if filters else ""
        out.append({"name": name, "label": name, "type": "query", "datasource": _DS,
                    "definition": f"label_values(vllm:num_requests_waiting{sel}, {name})",
                    "query": {"query": f"label_values(vllm:num_requests_waiting{sel}, {name})", "refId": f"var-{name}"},
                    "includeAll": True, "allValue": ".*", "multi": True, "refresh": 2, "sort": 1, "hide": 0,
                    "current": {"selected": True, "text": ["All"], "value": ["$__all"]}, "options": [], "regex": ""})
        filters.append(f'{name}=~"${name}"')
    return out


def grafana_json(d: Dashboard) -> dict:
    panels = []
    for i, p in enumerate(d.panels):
        custom = {"stacking": {"mode": "normal" if p.stacked else "none", "group": "A"},
                  "fillOpacity": 20 if p.stacked else 0, "showPoints": "never"}
        panels.append({
            "id": i + 1, "type": "timeseries", "title": p.title, "datasource": _DS,
            "gridPos": {"h": 8, "w": 12, "x": 12 * (i % 2), "y": 8 * (i // 2)},
            "fieldConfig": {"defaults": {"unit": p.unit, "custom": custom}, "overrides": []},
            "options": {"legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
                        "tooltip": {"mode": "multi", "sort": "desc"}},
            "targets": [{"refId": chr(ord("A") + k), "expr": t.expr, "legendFormat": t.legend, "range": True, "datasource": _DS}
                        for k, t in enumerate(p.targets)],
        })
    return {
        "uid": d.uid, "title": d.title, "schemaVersion": 39, "version": 1, "editable": True,
        "time": {"from": "now-1h", "to": "now"}, "refresh": "10s", "tags": ["turboprom"],
        "templating": {"list": _variables(d)}, "panels": panels,
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
