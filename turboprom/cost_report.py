"""Rendering of the cost report (planner/cost_report.py builds the data): text, JSON, CSV, HTML."""
from __future__ import annotations

import csv
import html
import io
import json
from datetime import datetime, timezone
from typing import Any

FORMATS = ("text", "json", "csv", "html")
CSV_COLUMNS = ["tenant", "pattern", "executions", "path", "p50_latency_s", "p99_latency_s", "cpu_s_total", "p99_cpu_s",
               "samples_scanned", "summary_executions", "mean_cpu_raw_s", "mean_cpu_summary_s", "measured_savings_cpu_s",
               "savings_basis", "sds"]


def _n(x: Any, digits: int = 4) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.{digits}g}"
    return str(x)


def _ts(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _storage_rows(rep: dict[str, Any]) -> list[tuple[str, int, float | None]]:
    st = rep.get("storage") or {}
    total_series = st.get("numSeriesTotal") or 0
    block_bytes = st.get("blockBytes") or 0
    out = []
    for item in st.get("seriesCountByMetricName", []):
        est = block_bytes * item["value"] / total_series if total_series and block_bytes else None
        out.append((item["name"], item["value"], est))
    return out


def render(rep: dict[str, Any], fmt: str) -> str:
    if fmt == "json":
        return json.dumps(rep, indent=2, default=str)
    if fmt == "csv":
        buf = io.StringIO()
        w = csv.DictWriter(buf, fieldnames=CSV_COLUMNS, extrasaction="ignore")
        w.writeheader()
        for p in rep["patterns"]:
            w.writerow({**p, "sds": " ".join(p.get("sds") or [])})
        return buf.getvalue()
    if fmt == "html":
        return render_html(rep)
    if fmt == "text":
        return render_text(rep)
    raise ValueError(f"unknown format {fmt!r}; use one of {', '.join(FORMATS)}")


def render_text(rep: dict[str, Any]) -> str:
    t = rep["totals"]
    lines = [
        f"TurboProm cost report, {_ts(rep['since_ms'])} .. {_ts(rep['generated_at_ms'])}" + (f", tenant {rep['tenant']}" if rep.get("tenant") else ""),
        "",
        f"queries: {t['executions']} executions of {t['patterns']} patterns, {t['summary_served_executions']} planner-served "
        "(from summaries and/or reused step answers)",
        f"query CPU: {t['query_cpu_s']:.3f} s   measured savings: {t['measured_savings_cpu_s']:.3f} s   "
        f"summary ingest CPU: {t['summary_ingest_cpu_s']:.3f} s (+ {t['summary_backfill_cpu_s']:.3f} s one-time backfill)   "
        f"net: {t['net_savings_cpu_s']:+.3f} s ({t['net_savings_after_backfill_cpu_s']:+.3f} s after the backfill)   "
        f"summary storage: {t['summary_bytes'] / 1024:.1f} KiB",
        "",
        f"{'pattern':<60} {'runs':>6} {'path':>8} {'p50 ms':>8} {'p99 ms':>8} {'CPU s':>9} {'p99 CPU ms':>10} {'samples':>11} {'saved CPU s':>11}",
    ]
    for p in rep["patterns"]:
        pat = p["pattern"] if len(p["pattern"]) <= 60 else p["pattern"][:57] + "..."
        lines.append(f"{pat:<60} {p['executions']:>6} {p['path']:>8} {_ms(p['p50_latency_s']):>8} {_ms(p['p99_latency_s']):>8} "
                     f"{p['cpu_s_total'] or 0:>9.3f} {_ms(p['p99_cpu_s']):>10} {p['samples_scanned']:>11} {_n(p['measured_savings_cpu_s']):>11}")
    if rep["summaries"]:
        lines += ["", f"{'summary (SDS)':<58} {'algorithm':>9} {'hits':>6} {'KiB':>9} {'ingest CPU s':>12}  error bound"]
        for s in rep["summaries"]:
            lines.append(f"{s['id']:<58} {s['algorithm']:>9} {s['hits'] or 0:>6} {(s['bytes'] or 0) / 1024:>9.1f} {s['ingest_cpu_seconds'] or 0:>12.4f}  {s['error_bound']}")
    if rep.get("retired"):
        lines += ["", "retired plans:"]
        for r in rep["retired"]:
            lines.append(f"  {r['id']}: {r['reason']}")
    srows = _storage_rows(rep)
    if srows:
        lines += ["", f"{'raw storage: metric':<58} {'series':>8} {'est. block bytes':>16}"]
        for name, n, est in srows:
            lines.append(f"{name:<58} {n:>8} {_n(est):>16}")
    if rep.get("tenants"):
        lines += ["", "per tenant: " + ", ".join(f"{k}: {v['executions']} runs, {v['cpu_s_total']:.3f} CPU s" for k, v in rep["tenants"].items())]
    return "\n".join(lines) + "\n"


def _ms(s: float | None) -> str:
    return "-" if s is None else f"{s * 1000:.1f}"


def _bar_svg(items: list[tuple[str, float, float]], title: str, a_label: str, b_label: str) -> str:
    """Horizontal grouped bars (a: raw, b: summary) as inline SVG: no scripts, prints anywhere."""
    if not items:
        return ""
    width, row, left = 900, 26, 360
    mx = max(max(abs(a), abs(b)) for _, a, b in items) or 1.0
    h = 40 + row * len(items)
    parts = [f'<svg width="{width}" height="{h}" role="img" aria-label="{html.escape(title)}"><text x="0" y="16" font-weight="600">{html.escape(title)}</text>',
             f'<rect x="{left}" y="4" width="12" height="12" fill="#e6522c"/><text x="{left + 16}" y="15" font-size="12">{html.escape(a_label)}</text>',
             f'<rect x="{left + 150}" y="4" width="12" height="12" fill="#1f77b4"/><text x="{left + 166}" y="15" font-size="12">{html.escape(b_label)}</text>']
    for i, (name, a, b) in enumerate(items):
        y = 30 + i * row
        label = name if len(name) <= 52 else name[:49] + "..."
        parts.append(f'<text x="0" y="{y + 14}" font-size="11" font-family="monospace">{html.escape(label)}</text>')
        # a negative value (a plan that cost more than it saved) is a bar of its size, grey
        wa = (width - left - 80) * abs(a) / mx
        wb = (width - left - 80) * abs(b) / mx
        fa, fb = ("#e6522c" if a >= 0 else "#888"), ("#1f77b4" if b >= 0 else "#888")
        parts.append(f'<rect x="{left}" y="{y}" width="{wa:.1f}" height="10" fill="{fa}"><title>{a:.6g}</title></rect>')
        parts.append(f'<rect x="{left}" y="{y + 11}" width="{wb:.1f}" height="10" fill="{fb}"><title>{b:.6g}</title></rect>')
        parts.append(f'<text x="{left + max(wa, wb) + 6:.1f}" y="{y + 16}" font-size="11">{a:.3g} / {b:.3g}</text>')
    parts.append("</svg>")
    return "".join(parts)


def render_html(rep: dict[str, Any]) -> str:
    t = rep["totals"]
    cpu_items = [(p["pattern"], (p["mean_cpu_raw_s"] or 0) * 1000, (p["mean_cpu_summary_s"] or 0) * 1000)
                 for p in rep["patterns"] if p["summary_executions"]][:15]
    lat_items = [(p["pattern"], (p["mean_wall_raw_s"] or 0) * 1000, (p["mean_wall_summary_s"] or 0) * 1000)
                 for p in rep["patterns"] if p["summary_executions"]][:15]
    top_items = [(p["pattern"], p["cpu_s_total"] or 0.0, (p["measured_savings_cpu_s"] or 0.0)) for p in rep["patterns"]][:15]
    rows = "".join(
        f"<tr><td><code>{html.escape(p['pattern'])}</code></td><td>{p['executions']}</td><td>{p['path']}</td><td>{_ms(p['p50_latency_s'])}</td>"
        f"<td>{_ms(p['p99_latency_s'])}</td><td>{p['cpu_s_total'] or 0:.3f}</td><td>{_ms(p['p99_cpu_s'])}</td><td>{p['samples_scanned']}</td>"
        f"<td>{_n(p['measured_savings_cpu_s'])}</td><td>{html.escape(p['savings_basis'])}</td></tr>" for p in rep["patterns"])
    srows = "".join(
        f"<tr><td><code>{html.escape(s['id'])}</code></td><td>{s['algorithm']}</td><td>{s['hits'] or 0}</td><td>{(s['bytes'] or 0) / 1024:.1f}</td>"
        f"<td>{s['ingest_cpu_seconds'] or 0:.4f}</td><td>{html.escape(str(s['error_bound']))}</td></tr>" for s in rep["summaries"])
    strows = "".join(f"<tr><td><code>{html.escape(n)}</code></td><td>{c}</td><td>{_n(e)}</td></tr>" for n, c, e in _storage_rows(rep))
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>TurboProm cost report</title>
<style>body{{font-family:sans-serif;margin:24px;color:#1f2328}} table{{border-collapse:collapse;margin:12px 0 24px}} td,th{{border:1px solid #d0d7de;padding:3px 8px;font-size:13px}}
th{{background:#f3f4f6}} .kpi{{display:inline-block;margin:0 28px 12px 0}} .kpi b{{display:block;font-size:22px}}</style></head><body>
<h1>TurboProm cost report</h1><p>{_ts(rep['since_ms'])} .. {_ts(rep['generated_at_ms'])}</p>
<div class="kpi"><b>{t['executions']}</b>query executions</div><div class="kpi"><b>{t['summary_served_executions']}</b>served from summaries</div>
<div class="kpi"><b>{t['query_cpu_s']:.3f} s</b>query CPU</div><div class="kpi"><b>{t['measured_savings_cpu_s']:.3f} s</b>measured savings</div>
<div class="kpi"><b>{t['summary_ingest_cpu_s']:.3f} s</b>summary ingest CPU</div><div class="kpi"><b>{t['summary_backfill_cpu_s']:.3f} s</b>one-time backfill CPU</div>
<div class="kpi"><b>{t['net_savings_cpu_s']:+.3f} s</b>net</div><div class="kpi"><b>{t['net_savings_after_backfill_cpu_s']:+.3f} s</b>net after the backfill</div>
<div class="kpi"><b>{t['summary_bytes'] / 1024:.1f} KiB</b>summary storage</div>
<h2>CPU per query: raw vs summary (ms)</h2>{_bar_svg(cpu_items, "mean CPU per execution (ms)", "raw path", "summary path")}
<h2>Latency per query: raw vs summary (ms)</h2>{_bar_svg(lat_items, "mean latency per execution (ms)", "raw path", "summary path")}
<h2>Where query CPU goes</h2>{_bar_svg(top_items, "total CPU s and measured savings", "CPU s spent", "CPU s saved")}
<h2>Patterns</h2><table><tr><th>pattern</th><th>runs</th><th>path</th><th>p50 ms</th><th>p99 ms</th><th>CPU s</th><th>p99 CPU ms</th><th>samples</th><th>saved CPU s</th><th>basis</th></tr>{rows}</table>
<h2>Summaries (ingest-side cost included)</h2><table><tr><th>SDS</th><th>algorithm</th><th>hits</th><th>KiB</th><th>ingest CPU s</th><th>error bound</th></tr>{srows}</table>
<h2>Raw storage by metric (top cardinality)</h2><table><tr><th>metric</th><th>series</th><th>est. block bytes</th></tr>{strows}</table>
</body></html>
"""
