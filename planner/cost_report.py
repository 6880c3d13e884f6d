"""Cost report data: what each recurring query pattern costs on the raw path and from summaries,
and what the summaries cost at ingest (CPU) and at rest (bytes), plus raw storage and cardinality.

Sources: the query log (every evaluated query with its CPU, samples and serving path), the planner's
SDS accounting (ingest CPU seconds, bytes, hits), the accuracy canary's shadow raw re-evaluations,
and storage statistics. Savings are *measured*, per way of serving (``_savings``): refreshes that
reused step answers against the pattern's raw executions (the same query evaluated whole); answers a
summary gave without reuse against the canary's shadow pairs (the raw path timed on the very sub-query
the summary just answered, same data and moment), or the raw executions where no pair exists. Totals
subtract the summaries' live fold CPU and, separately stated, their one-time backfill CPU.
"""
from __future__ import annotations

import json
import time
from typing import Any

_PATTERN_SQL = """
SELECT tenant, pattern,
       count(*)                                         AS executions,
       quantile_cont(wall_s, 0.5)                       AS p50_latency_s,
       quantile_cont(wall_s, 0.99)                      AS p99_latency_s,
       sum(cpu_s)                                       AS cpu_s_total,
       quantile_cont(cpu_s, 0.99)                       AS p99_cpu_s,
       sum(samples)                                     AS samples_scanned,
       sum(CASE WHEN {SERVED} THEN 1 ELSE 0 END)          AS summary_executions,
       avg(CASE WHEN {SERVED} THEN cpu_s END)             AS mean_cpu_summary_s,
       avg(CASE WHEN NOT {SERVED} THEN cpu_s END)         AS mean_cpu_raw_s,
       avg(CASE WHEN {SERVED} THEN wall_s END)            AS mean_wall_summary_s,
       avg(CASE WHEN NOT {SERVED} THEN wall_s END)        AS mean_wall_raw_s,
       sum(CASE WHEN {REUSED} THEN 1 ELSE 0 END)          AS reuse_executions,
       avg(CASE WHEN {REUSED} THEN cpu_s END)             AS mean_cpu_reuse_s,
       avg(CASE WHEN {SERVED} AND NOT {REUSED} THEN cpu_s END) AS mean_cpu_summary_only_s,
       sum(CASE WHEN error IS NOT NULL AND error <> '' THEN 1 ELSE 0 END) AS errors,
       min(expr)                                        AS example
FROM query_log
WHERE arrival_ms >= ? {tenant_filter}
GROUP BY tenant, pattern
ORDER BY cpu_s_total DESC
LIMIT ?
"""

_TOTALS_SQL = """
SELECT count(*), coalesce(sum(cpu_s), 0), count(DISTINCT pattern),
       sum(CASE WHEN {SERVED} THEN 1 ELSE 0 END)
FROM query_log WHERE arrival_ms >= ? {tenant_filter}
"""

_SDS_PATHS_SQL = """
SELECT pattern, list(DISTINCT p) AS sds
FROM (SELECT pattern, unnest(CAST(json_extract_string(paths, '$[*]') AS VARCHAR[])) AS p FROM query_log WHERE arrival_ms >= ?)
WHERE p LIKE 'summary:%'
GROUP BY pattern
"""


# planner-served: a summary answered a sub-tree, or earlier step answers stood in for some steps
_SERVED = "(paths LIKE '%summary:%' OR paths LIKE '%steps:reused%')"
_REUSED = "(paths LIKE '%steps:reused%')"


def _f(x: Any) -> float | None:
    return None if x is None else float(x)


def _savings(d: dict[str, Any], pairs: list[float]) -> tuple[float | None, str]:
    """(CPU seconds saved by a pattern's planner-served executions, the basis), by how each was served.

    Refreshes that reused step answers are compared with the pattern's raw executions (the same query
    evaluated whole: what a refresh costs without reuse). Executions a summary answered without reuse
    are credited with the mean of the summaries' shadow pairs (raw and summary timed on the same
    sub-query at the same moment), or compared with the raw executions where no pair exists."""
    raw = d["mean_cpu_raw_s"]
    n_reuse = d["reuse_executions"]
    n_summary = d["summary_executions"] - n_reuse
    total, parts = 0.0, []
    if n_reuse:
        if raw is None or d["mean_cpu_reuse_s"] is None:
            parts.append(f"{n_reuse} reusing refreshes: no raw execution to compare with")
        else:
            total += (raw - d["mean_cpu_reuse_s"]) * n_reuse
            parts.append(f"{n_reuse} reusing refreshes vs raw executions")
    if n_summary > 0:
        if pairs:
            total += sum(pairs) / len(pairs) * n_summary
            parts.append(f"{n_summary} summary answers vs {len(pairs)} paired shadow runs")
        elif raw is not None and d["mean_cpu_summary_only_s"] is not None:
            total += (raw - d["mean_cpu_summary_only_s"]) * n_summary
            parts.append(f"{n_summary} summary answers vs raw executions")
        else:
            parts.append(f"{n_summary} summary answers: no raw reference yet")
    counted = [p for p in parts if "no raw" not in p]
    if not counted:
        return None, "; ".join(parts) if parts else "not summary-served"
    return total, "; ".join(parts)


def build_report(query_log: Any, planner: Any = None, canary: Any = None, storage: Any = None, *,
                 since_ms: int | None = None, tenant: str | None = None, limit: int = 200) -> dict[str, Any]:
    now_ms = int(time.time() * 1000)
    since = since_ms if since_ms is not None else now_ms - 24 * 3_600_000
    if query_log is not None:
        query_log.flush()
    tf = "AND tenant = ?" if tenant else ""
    params: list[Any] = [since] + ([tenant] if tenant else []) + [limit]
    rows = query_log.sql(_PATTERN_SQL.format(tenant_filter=tf, SERVED=_SERVED, REUSED=_REUSED), params) if query_log is not None else []
    cols = ["tenant", "pattern", "executions", "p50_latency_s", "p99_latency_s", "cpu_s_total", "p99_cpu_s", "samples_scanned",
            "summary_executions", "mean_cpu_summary_s", "mean_cpu_raw_s", "mean_wall_summary_s", "mean_wall_raw_s",
            "reuse_executions", "mean_cpu_reuse_s", "mean_cpu_summary_only_s", "errors", "example"]
    counts = ("executions", "summary_executions", "samples_scanned", "errors", "reuse_executions")
    sds_by_pattern: dict[str, list[str]] = {}
    if query_log is not None:
        try:
            for pat, lst in query_log.sql(_SDS_PATHS_SQL, [since]):
                sds_by_pattern[pat] = sorted(s.split(":", 1)[1] for s in lst)
        except Exception:  # noqa: BLE001 - older DuckDB without json helpers: no per-pattern SDS list
            pass
    paired: dict[str, list[float]] = {}  # sds id -> raw CPU - summary CPU of each shadow pair
    if canary is not None:
        for rec in canary.records():
            if rec.get("raw_cpu_s") is not None and rec.get("served_cpu_s") is not None:
                paired.setdefault(rec["sds"], []).append(float(rec["raw_cpu_s"]) - float(rec["served_cpu_s"]))
    patterns = []
    total_saved = 0.0
    for r in rows:
        d = dict(zip(cols, r))
        for k in cols[2:-1]:
            d[k] = int(d[k] or 0) if k in counts else _f(d[k])
        d["path"] = "summary" if d["summary_executions"] == d["executions"] and d["executions"] else (
            "mixed" if d["summary_executions"] else "raw")
        d["sds"] = sds_by_pattern.get(d["pattern"], [])
        saved, basis = _savings(d, [v for s in d["sds"] for v in paired.get(s, [])])
        if saved is not None:
            d["measured_savings_cpu_s"] = saved
            d["savings_basis"] = basis
            served_cpu = (d["mean_cpu_summary_s"] or 0.0) * d["summary_executions"]
            d["speedup"] = (served_cpu + saved) / served_cpu if served_cpu > 0 else None
            total_saved += saved
        else:
            d["measured_savings_cpu_s"] = None
            d["savings_basis"] = basis
            d["speedup"] = None
        patterns.append(d)
    summaries = []
    ingest_cpu = 0.0
    backfill_cpu = 0.0
    summary_bytes = 0
    retired: list[dict[str, Any]] = []
    if planner is not None:
        for p in planner.plans():
            summaries.append({k: p.get(k) for k in ("id", "metric", "algorithm", "pane_ms", "error_bound", "series", "bytes", "hits",
                                                     "windows_served", "saved_samples", "ingest_cpu_seconds", "backfill_cpu_seconds", "ingested_samples", "reason",
                                                     "measured")})
            ingest_cpu += float(p.get("ingest_cpu_seconds") or 0.0)
            backfill_cpu += float(p.get("backfill_cpu_seconds") or 0.0)
            summary_bytes += int(p.get("bytes") or 0)
        retired = [dict(r) for r in planner.retired.values() if r.get("retired_at", 0) * 1000 >= since]
        for r in retired:  # plans retired in the window cost summarization CPU too
            ingest_cpu += float(r.get("ingest_cpu_seconds") or 0.0)
            backfill_cpu += float(r.get("backfill_cpu_seconds") or 0.0)
    storage_info: dict[str, Any] = {}
    if storage is not None:
        st = storage.stats()
        storage_info = st if isinstance(st, dict) else json.loads(json.dumps(st, default=str))
    # Totals over every pattern in the window, not only the listed (top-``limit``) ones.
    if query_log is not None:
        n_exec, raw_cpu, n_pat, n_summary = query_log.sql(_TOTALS_SQL.format(tenant_filter=tf, SERVED=_SERVED), params[:-1])[0]
        raw_cpu, n_exec, n_pat, n_summary = float(raw_cpu or 0.0), int(n_exec or 0), int(n_pat or 0), int(n_summary or 0)
    else:
        raw_cpu, n_exec, n_pat, n_summary = 0.0, 0, 0, 0
    tenants: dict[str, dict[str, float]] = {}
    for p in patterns:
        t = tenants.setdefault(p["tenant"], {"executions": 0, "cpu_s_total": 0.0, "samples_scanned": 0})
        t["executions"] += p["executions"]
        t["cpu_s_total"] += p["cpu_s_total"] or 0.0
        t["samples_scanned"] += p["samples_scanned"]
    return {
        "generated_at_ms": now_ms, "since_ms": since, "tenant": tenant,
        "totals": {
            "query_cpu_s": raw_cpu, "measured_savings_cpu_s": total_saved, "summary_ingest_cpu_s": ingest_cpu,
            "summary_backfill_cpu_s": backfill_cpu,
            # net of everything the summaries cost, and of what they cost from here on (the backfill is paid)
            "net_savings_cpu_s": total_saved - ingest_cpu - backfill_cpu,
            "net_savings_after_backfill_cpu_s": total_saved - ingest_cpu, "summary_bytes": summary_bytes,
            "patterns": n_pat, "executions": n_exec, "summary_served_executions": n_summary,
            "listed_patterns": len(patterns),
        },
        "patterns": patterns, "summaries": summaries, "retired": retired, "tenants": tenants, "storage": storage_info,
    }
