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


class RuleFileError(ValueError):
    """A rule file that cannot be loaded; ``str()`` names the file, line and problem (one per line)."""


GROUP_FIELDS = ("name", "interval", "limit", "rules")
RULE_FIELDS = ("record", "alert", "expr", "for", "keep_firing_for", "labels", "annotations")


def _rule_paths(patterns: list[str], base_dir: str | None) -> list[str]:
    out: list[str] = []
    for pat in patterns:
        p = pat if (base_dir is None or Path(pat).is_absolute()) else str(Path(base_dir) / pat)
        found = sorted(glob.glob(p))
        if not found and not glob.has_magic(p):
            raise RuleFileError(f"rule file {p} not found (rule_files: {pat!r})")
        out += found
    return out


def _mapping(node: Any) -> dict[str, tuple[Any, Any]]:
    return {str(k.value): (k, v) for k, v in node.value} if isinstance(node, yaml.MappingNode) else {}


def check_rule_file(path: str) -> list[str]:
    """Problems of one rule file, each ``FILE:LINE: message`` (as promtool check rules finds them): bad
    YAML, unknown fields, a rule without record/alert or expr, an expression that does not parse,
    a bad for/interval duration, repeated group names, a rule repeated with the same labels in a group."""
    from planner.planner import parse_duration_ms
    from promql.engine import parse as parse_promql

    try:
        text = Path(path).read_text()
    except OSError as e:
        return [f"{path}: cannot read rule file: {e.strerror or e}"]
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else path
        return [f"{where}: invalid YAML: {getattr(e, 'problem', None) or e}"]
    errs: list[str] = []

    def err(node: Any, msg: str) -> None:
        errs.append(f"{path}:{node.start_mark.line + 1}: {msg}")

    def unknown(m: dict[str, tuple[Any, Any]], known: tuple[str, ...], where: str) -> None:
        for k, (kn, _) in m.items():
            if k not in known:
                err(kn, f'{where}unknown field "{k}" (known: {", ".join(known)})')

    def duration(node: Any, where: str) -> None:
        if not isinstance(node, yaml.ScalarNode) or node.tag.endswith(":bool"):
            err(node, f"{where}: not a valid duration")
            return
        try:
            parse_duration_ms(node.value)
        except ValueError as e:
            err(node, f"{where}: {e}")

    if root is None:
        return []
    top = _mapping(root)
    if not isinstance(root, yaml.MappingNode):
        return [f"{path}:{root.start_mark.line + 1}: a rule file must be a mapping with 'groups'"]
    unknown(top, ("groups",), "")
    groups = top.get("groups", (None, None))[1]
    if groups is None or (isinstance(groups, yaml.ScalarNode) and groups.tag.endswith(":null")):
        return errs
    if not isinstance(groups, yaml.SequenceNode):
        err(groups, "groups must be a list")
        return errs
    seen_groups: dict[str, int] = {}
    for gnode in groups.value:
        g = _mapping(gnode)
        if not isinstance(gnode, yaml.MappingNode):
            err(gnode, "a rule group must be a mapping with name and rules")
            continue
        name = g["name"][1].value if "name" in g and isinstance(g["name"][1], yaml.ScalarNode) else ""
        if not name:
            err(gnode, "groupname must not be empty")
        elif name in seen_groups:
            err(g["name"][0], f'groupname: "{name}" is repeated in the same file (first at line {seen_groups[name]})')
        else:
            seen_groups[name] = g["name"][0].start_mark.line + 1
        unknown(g, GROUP_FIELDS, f'group "{name}": ')
        if "interval" in g:
            duration(g["interval"][1], f'group "{name}": interval')
        if "limit" in g and not (g["limit"][1].tag.endswith(":int") and g["limit"][1].value.isdigit()):
            err(g["limit"][1], f'group "{name}": limit must be a non-negative integer, got {g["limit"][1].value!r}')
        rules = g.get("rules", (None, None))[1]
        if rules is None or (isinstance(rules, yaml.ScalarNode) and rules.tag.endswith(":null")):
            continue
        if not isinstance(rules, yaml.SequenceNode):
            err(rules, f'group "{name}": rules must be a list')
            continue
        seen_rules: dict[tuple, int] = {}
        for i, rnode in enumerate(rules.value, 1):
            r = _mapping(rnode)
            if not isinstance(rnode, yaml.MappingNode):
                err(rnode, f'group "{name}", rule {i}: a rule must be a mapping')
                continue
            rname = str((r.get("record") or r.get("alert") or (None, None))[1].value) \
                if isinstance((r.get("record") or r.get("alert") or (None, None))[1], yaml.ScalarNode) else ""
            where = f'group "{name}", rule {i}, "{rname}"' if rname else f'group "{name}", rule {i}'
            unknown(r, RULE_FIELDS, f"{where}: ")
            if "record" in r and "alert" in r:
                err(rnode, f"{where}: only one of 'record' and 'alert' must be set")
            elif "record" not in r and "alert" not in r:
                err(rnode, f"{where}: one of 'record' or 'alert' must be set")
            elif not rname:
                err(rnode, f"{where}: the rule name ('record' or 'alert') must not be empty")
            if "record" in r:
                for bad in ("for", "keep_firing_for", "annotations"):
                    if bad in r:
                        err(r[bad][0], f"{where}: invalid field '{bad}' in recording rule")
            expr = r.get("expr", (None, None))[1]
            if expr is None or not isinstance(expr, yaml.ScalarNode) or not str(expr.value).strip():
                err(rnode, f"{where}: field 'expr' must be set in rule")
            else:
                try:
                    parse_promql(str(expr.value))
                except Exception as e:  # noqa: BLE001 - any parser complaint is the rule's problem
                    err(expr, f"{where}: could not parse expression: {e}")
            for d in ("for", "keep_firing_for"):
                if d in r:
                    duration(r[d][1], f"{where}: {d}")
            for m in ("labels", "annotations"):
                if m in r and not isinstance(r[m][1], yaml.MappingNode) and not r[m][1].tag.endswith(":null"):
                    err(r[m][1], f"{where}: {m} must be a mapping of names to values")
            if rname:
                labels = tuple(sorted((str(k.value), str(v.value)) for k, v in r["labels"][1].value)) \
                    if "labels" in r and isinstance(r["labels"][1], yaml.MappingNode) else ()
                key = ("record" in r, rname, labels)
                if key in seen_rules:
                    err(rnode, f'{where}: the same rule (name and labels) is already rule {seen_rules[key]} of this group')
                else:
                    seen_rules[key] = i
    return errs


def check_rule_files(patterns: list[str], base_dir: str | None) -> list[str]:
    """Check every file the ``rule_files`` patterns name; RuleFileError listing all problems. Returns the files."""
    files = _rule_paths(patterns, base_dir)
    errs = [e for f in files for e in check_rule_file(f)]
    if errs:
        raise RuleFileError("\n".join(errs))
    return files


def load_rule_files(patterns: list[str], base_dir: str | None, default_interval_s: float) -> list[Group]:
    groups: list[Group] = []
    for f in check_rule_files(patterns, base_dir):
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
        stop, groups = self._stop, self.groups  # a reload (replace_groups) starts a new thread with its own
        next_at = {id(g): time.time() for g in groups}
        while not stop.is_set():
            now = time.time()
            for g in groups:
                if now >= next_at[id(g)]:
                    self.eval_group(g, int(now * 1000))
                    next_at[id(g)] = now + g.interval_s
            wait = max(0.05, min(next_at.values()) - time.time())
            stop.wait(min(wait, 1.0))

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def replace_groups(self, groups: list[Group]) -> None:
        """Config reload: evaluate ``groups`` from now on. A rule that is unchanged (same file, group,
        name, expression and labels) keeps its health, last evaluation and active alerts."""
        running = self._thread is not None
        self.stop()
        old = {(g.file, g.name, r.kind, r.name, r.expr, tuple(sorted(r.labels.items()))): (g, r)
               for g in self.groups for r in g.rules}
        for g in groups:
            for r in g.rules:
                hit = old.get((g.file, g.name, r.kind, r.name, r.expr, tuple(sorted(r.labels.items()))))
                if hit is not None:
                    prev = hit[1]
                    r.health, r.last_error, r.last_eval, r.eval_time, r.active = \
                        prev.health, prev.last_error, prev.last_eval, prev.eval_time, prev.active
                    g.last_eval, g.eval_time = hit[0].last_eval, hit[0].eval_time
        self.groups = groups
        self._stop = threading.Event()
        self._thread = None
        if running or groups:
            self.start()

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
