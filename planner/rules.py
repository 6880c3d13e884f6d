"""Prometheus rule files: groups evaluated on their interval; recording rules append their results
through the ingest pipeline (so summarizer and other sinks see them), alerting rules track state.

Rule expressions run through the planned engine with ``origin="rule"``: they are logged and, recurring
every interval by construction, are prime planner candidates.

``api_groups()`` / ``api_alerts()`` return Prometheus's ``/api/v1/rules`` / ``/api/v1/alerts`` shapes
(groups: name, file, rules[], interval, limit, evaluationTime, lastEvaluation; recording rule: name,
query, labels, health, lastError, evaluationTime, lastEvaluation, type "recording"; alerting rule adds
state, duration, keepFiringFor, annotations, alerts[]).
"""
from __future__ import annotations

import datetime as _dt
import glob
import logging
import math
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import yaml

from storage.batch import SampleBatch
from storage.labels import METRIC_NAME, Labels, make_labels

log = logging.getLogger("turboprom.planner")


def _dur_s(v: Any, default: float) -> float:
    from planner.planner import parse_duration_ms

    if v is None:
        return default
    return parse_duration_ms(str(v)) / 1000.0


def _rfc3339(ts: float) -> str:
    if ts <= 0:
        return "0001-01-01T00:00:00Z"
    return _dt.datetime.fromtimestamp(ts, _dt.timezone.utc).isoformat().replace("+00:00", "Z")


@dataclass
class Rule:
    name: str
    expr: str
    kind: str  # "recording" | "alerting"
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    for_s: float = 0.0
    keep_firing_for_s: float = 0.0
    health: str = "unknown"
    last_error: str = ""
    last_eval: float = 0.0
    eval_time: float = 0.0
    active: dict[Labels, dict[str, Any]] = field(default_factory=dict)  # alerting: labels -> alert


@dataclass
class Group:
    name: str
    file: str
    interval_s: float
    rules: list[Rule]
    limit: int = 0
    last_eval: float = 0.0
    eval_time: float = 0.0


def load_rule_files(patterns: list[str], base_dir: str | None, default_interval_s: float) -> list[Group]:
    groups: list[Group] = []
    for pat in patterns:
        p = pat if (base_dir is None or Path(pat).is_absolute()) else str(Path(base_dir) / pat)
        for f in sorted(glob.glob(p)):
            doc = yaml.safe_load(Path(f).read_text()) or {}
            for g in doc.get("groups", []) or []:
                if "name" not in g:
                    raise ValueError(f"{f}: rule group without a name")
                rules = []
                for r in g.get("rules", []) or []:
                    if "record" in r:
                        rules.append(Rule(str(r["record"]), str(r["expr"]), "recording", dict(r.get("labels") or {})))
                    elif "alert" in r:
                        rules.append(Rule(str(r["alert"]), str(r["expr"]), "alerting", dict(r.get("labels") or {}),
                                          {k: str(v) for k, v in (r.get("annotations") or {}).items()},
                                          _dur_s(r.get("for"), 0.0), _dur_s(r.get("keep_firing_for"), 0.0)))
                    else:
                        raise ValueError(f"{f}: group {g['name']}: rule needs 'record' or 'alert'")
                groups.append(Group(str(g["name"]), f, _dur_s(g.get("interval"), default_interval_s), rules,
                                    int(g.get("limit", 0) or 0)))
    return groups


class RuleManager:
    def __init__(self, groups: list[Group], engine: Any, append: Callable[[SampleBatch], Any]):
        self.groups = groups
        self.engine = engine
        self.append = append
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @classmethod
    def from_config(cls, raw: dict[str, Any], config_file: str | None, engine: Any,
                    append: Callable[[SampleBatch], Any]) -> "RuleManager":
        glob_iv = _dur_s((raw.get("global") or {}).get("evaluation_interval"), 60.0)
        base = str(Path(config_file).parent) if config_file else None
        return cls(load_rule_files(list(raw.get("rule_files") or []), base, glob_iv), engine, append)

    def eval_group(self, g: Group, ts_ms: int) -> None:
        t0 = time.perf_counter()
        for r in g.rules:
            r0 = time.perf_counter()
            try:
                kw = {"origin": "rule"} if hasattr(self.engine, "hook") else {}
                res = self.engine.instant_query(r.expr, ts_ms, **kw)
                labels, vals = self._vector(res)
                if r.kind == "recording":
                    out = []
                    for lbl, v in zip(labels, vals):
                        d = dict(lbl)
                        d[METRIC_NAME] = r.name
                        d.update(r.labels)
                        out.append((make_labels(d), np.array([ts_ms]), np.array([v])))
                    if out:
                        self.append(SampleBatch.from_series(out))
                else:
                    self._alerts(r, labels, vals, ts_ms / 1000.0)
                r.health, r.last_error = "ok", ""
            except Exception as e:  # noqa: BLE001 - one bad rule must not stop the group
                r.health, r.last_error = "err", str(e)
            r.last_eval = time.time()
            r.eval_time = time.perf_counter() - r0
        g.last_eval = time.time()
        g.eval_time = time.perf_counter() - t0

    @staticmethod
    def _vector(res: Any) -> tuple[list[Labels], list[float]]:
        if res.result_type == "scalar":
            return [()], [float(res.scalar)]
        if res.result_type != "vector":
            raise ValueError(f"rule result must be a vector or scalar, got {res.result_type}")
        return list(res.labels), [float(v) for v in res.values]

    def _alerts(self, r: Rule, labels: list[Labels], vals: list[float], now: float) -> None:
        seen = set()
        for lbl, v in zip(labels, vals):
            d = {k: x for k, x in lbl if k != METRIC_NAME}
            d.update(r.labels)
            d["alertname"] = r.name
            key = make_labels(d)
            seen.add(key)
            a = r.active.get(key)
            if a is None:
                a = r.active[key] = {"labels": dict(key), "annotations": dict(r.annotations), "state": "pending",
                                     "activeAt": now, "value": v}
            a["value"] = v
            if a["state"] == "pending" and now - a["activeAt"] >= r.for_s:
                a["state"] = "firing"
        for key in [k for k in r.active if k not in seen]:
            del r.active[key]

    # --- loop ------------------------------------------------------------------------------
    def start(self) -> None:
        if self.groups and self._thread is None:
            self._thread = threading.Thread(target=self._run, name="rules", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        next_at = {id(g): time.time() for g in self.groups}
        while not self._stop.is_set():
            now = time.time()
            for g in self.groups:
                if now >= next_at[id(g)]:
                    self.eval_group(g, int(now * 1000))
                    next_at[id(g)] = now + g.interval_s
            wait = max(0.05, min(next_at.values()) - time.time())
            self._stop.wait(min(wait, 1.0))

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    # --- API shapes ------------------------------------------------------------------------
    def _rule_json(self, r: Rule) -> dict[str, Any]:
        base = {"name": r.name, "query": r.expr, "labels": dict(r.labels), "health": r.health,
                "lastError": r.last_error or None, "evaluationTime": r.eval_time, "lastEvaluation": _rfc3339(r.last_eval)}
        if not base["lastError"]:
            base.pop("lastError")
        if r.kind == "recording":
            base["type"] = "recording"
            return base
        state = "firing" if any(a["state"] == "firing" for a in r.active.values()) else \
            ("pending" if r.active else "inactive")
        base.update({"state": state, "duration": r.for_s, "keepFiringFor": r.keep_firing_for_s,
                     "annotations": dict(r.annotations), "alerts": self._alert_list(r), "type": "alerting"})
        return base

    def _alert_list(self, r: Rule) -> list[dict[str, Any]]:
        return [{"labels": a["labels"], "annotations": a["annotations"], "state": a["state"],
                 "activeAt": _rfc3339(a["activeAt"]), "value": _fmt(a["value"])} for a in r.active.values()]

    def api_groups(self) -> list[dict[str, Any]]:
        return [{"name": g.name, "file": g.file, "rules": [self._rule_json(r) for r in g.rules], "interval": g.interval_s,
                 "limit": g.limit, "evaluationTime": g.eval_time, "lastEvaluation": _rfc3339(g.last_eval)}
                for g in self.groups]

    def api_alerts(self) -> list[dict[str, Any]]:
        return [a for g in self.groups for r in g.rules if r.kind == "alerting" for a in self._alert_list(r)]


def _fmt(v: float) -> str:
    """Go's strconv.FormatFloat(v, 'e', -1, 64), as Prometheus renders alert values."""
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return np.format_float_scientific(float(v), unique=True, exp_digits=2).replace(".e", "e")
