"""`turboprom plan list|show|explain QUERY`: talks to a running server's /api/v1/planner endpoints."""
from __future__ import annotations

import argparse
import json
import sys
import urllib.error
import urllib.parse
import urllib.request
from typing import Any


def add_parser(sub: Any) -> None:
    p = sub.add_parser("plan", help="show planner plans (SDS), their hits, savings, storage; explain a query's path")
    p.add_argument("action", choices=["list", "show", "explain", "candidates"])
    p.add_argument("arg", nargs="?", help="plan id (show) or PromQL query (explain)")
    p.add_argument("--url", default="http://127.0.0.1:9090", help="server URL (default http://127.0.0.1:9090)")
    p.add_argument("--time", default=None, help="explain: evaluation time (RFC 3339 or unix seconds)")
    p.add_argument("--start", default=None)
    p.add_argument("--end", default=None)
    p.add_argument("--step", default=None)
    p.add_argument("--approx", default=None, choices=["true", "false"],
                   help="explain: as a request with approx=true|false (default: the server's planner.approximate)")
    p.add_argument("--json", action="store_true", help="print raw JSON")


def _get(url: str, path: str, params: dict[str, str] | None = None) -> Any:
    q = ("?" + urllib.parse.urlencode({k: v for k, v in (params or {}).items() if v is not None})) if params else ""
    try:
        with urllib.request.urlopen(url.rstrip("/") + path + q, timeout=30) as r:
            body = json.loads(r.read())
    except urllib.error.HTTPError as e:
        body = json.loads(e.read() or b"{}")
    if body.get("status") != "success":
        raise SystemExit(f"error: {body.get('errorType', '?')}: {body.get('error', body)}")
    return body["data"]


def _fmt_bytes(n: int) -> str:
    for u in ("B", "KiB", "MiB", "GiB"):
        if n < 1024:
            return f"{n:.0f} {u}"
        n /= 1024
    return f"{n:.1f} TiB"


def run(a: argparse.Namespace, out: Any = sys.stdout) -> int:
    if a.action == "list":
        d = _get(a.url, "/api/v1/planner/plans")
        if a.json:
            print(json.dumps(d, indent=2), file=out)
            return 0
        print(f"{'ID':40} {'ALG':5} {'PANE':>6} {'SERIES':>7} {'HITS':>6} {'SAVED SAMPLES':>14} {'STORAGE':>10} BACKFILL  ERROR BOUND", file=out)
        for p in d["plans"]:
            bf = p["backfill"]
            print(f"{p['id']:40} {p['algorithm']:5} {p['pane_ms'] // 1000:>5}s {p['series']:>7} {p['hits']:>6} "
                  f"{p['saved_samples']:>14} {_fmt_bytes(p['bytes']):>10} {bf['state']:9} {p['error_bound']}", file=out)
        print(f"summarizer: {d['summarizer']['samples']} samples folded, {d['summarizer']['cpu_seconds']:.3f} CPU-s", file=out)
        sa = d.get("step_answers")
        if sa:
            print(f"step answers: {sa['reused_steps']} of {sa['steps']} steps reused ({sa['reuse_ratio']:.1%}), "
                  f"{sa['invalidated_steps']} invalidated by late writes, {_fmt_bytes(sa['bytes'])} kept", file=out)
        for r in d.get("retired") or []:
            print(f"retired {r['id']}: {r['reason']}", file=out)
        return 0
    if a.action == "show":
        if not a.arg:
            raise SystemExit("error: plan show needs a plan id")
        print(json.dumps(_get(a.url, f"/api/v1/planner/plans/{urllib.parse.quote(a.arg)}"), indent=2), file=out)
        return 0
    if a.action == "candidates":
        print(json.dumps(_get(a.url, "/api/v1/planner/candidates"), indent=2), file=out)
        return 0
    if not a.arg:
        raise SystemExit("error: plan explain needs a query")
    d = _get(a.url, "/api/v1/planner/explain", {"query": a.arg, "time": a.time, "start": a.start, "end": a.end, "step": a.step,
                                                  "approx": a.approx})
    if a.json:
        print(json.dumps(d, indent=2), file=out)
        return 0
    print(f"pattern: {d['pattern']}", file=out)
    for s in d["subtrees"]:
        extra = f" ({s['error_bound']})" if "error_bound" in s else ""
        why = f" -- {s['why']}" if s.get("why") else ""
        print(f"  {s['function']}({s['metric']}[{s['range_ms'] // 1000}s]) -> {s['path']}{extra}{why}", file=out)
    if d.get("why"):
        print(f"  raw: {d['why']}", file=out)
    return 0
