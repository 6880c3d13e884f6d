"""Prometheus rule files: groups evaluated on their interval; recording rules append their results
through the ingest pipeline (so summarizer and other sinks see them), alerting rules track alert state
as Prometheus 2.42 does (rules/alerting.go) and hand the alerts due to be sent to a notify function
(turboprom/alert_notifier.py queues and delivers them to Alertmanager).

Rule expressions run through the planned engine with ``origin="rule"``: they are logged and, recurring
every interval by construction, are prime planner candidates.

Alerting semantics: an alert is pending from the first evaluation its labels appear in the result
(``activeAt``), firing once it has been pending for ``for`` (``firedAt``, the ``startsAt`` sent to
Alertmanager), and on disappearing is kept firing for ``keep_firing_for``, then resolved (``endsAt`` =
resolution time) and kept and resent as resolved for 15 minutes. Labels and annotations are templates
(planner/alert_template.py). Every evaluation writes ``ALERTS{alertstate=...}`` = 1 and
``ALERTS_FOR_STATE`` = activeAt (unix seconds) for pending and firing alerts, and stale markers for
series of the previous evaluation that are gone. After a restart the ``for`` state is restored from
``ALERTS_FOR_STATE`` after the second evaluation of each group (``--rules.alert.for-outage-tolerance``,
``--rules.alert.for-grace-period``). An alert is (re)sent when it fires, when it resolves, and every
``--rules.alert.resend-delay`` while it stays firing, with ``endsAt`` = now + 4 x max(resend delay,
interval) so that Alertmanager resolves it by itself when sending stops.

``api_groups()`` / ``api_alerts()`` return Prometheus's ``/api/v1/rules`` / ``/api/v1/alerts`` shapes
(groups: name, file, rules[], interval, limit, evaluationTime, lastEvaluation; recording rule: name,
query, labels, health, lastError, evaluationTime, lastEvaluation, type "recording"; alerting rule:
state, name, query, duration, keepFiringFor, labels, annotations, alerts[], health, lastError,
evaluationTime, lastEvaluation, type "alerting").
"""
from __future__ import annotations

import datetime as _dt
import glob
import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import yaml

from storage.batch import SampleBatch
from storage.labels import METRIC_NAME, Labels, make_labels
from storage.stale import STALE_NAN
from storage.go_format import format_float_e
from promql.query_opts import QueryOpts

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
    active: dict[Labels, "Alert"] = field(default_factory=dict)  # alerting: final labels -> alert
    restored: bool = True  # alerting: ALERTS series are written once the for state is restored
    prev_series: set[Labels] = field(default_factory=set)  # written by the last evaluation (for staleness)
    query: str = ""  # the expression as Prometheus prints it (API, generatorURL)

    def __post_init__(self) -> None:
        if not self.query:
            try:
                from promql.printer import format_query

                self.query = format_query(self.expr)
            except Exception:  # noqa: BLE001 - a rule that does not parse reports it when evaluated
                self.query = self.expr


@dataclass
class Group:
    name: str
    file: str
    interval_s: float
    rules: list[Rule]
    limit: int = 0
    last_eval: float = 0.0
    eval_time: float = 0.0
    evaluations: int = 0
    should_restore: bool = False  # restore alerts' for state after the second evaluation


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


def load_rule_files_from_config(raw: dict[str, Any], config_file: str | None) -> list[Group]:
    """The groups of the config's ``rule_files`` (relative to the config file), default interval
    ``global.evaluation_interval``."""
    glob_iv = _dur_s((raw.get("global") or {}).get("evaluation_interval"), 60.0)
    base = str(Path(config_file).parent) if config_file else None
    return load_rule_files(list(raw.get("rule_files") or []), base, glob_iv)


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


@dataclass
class Alert:
    """One instance of an alerting rule (Prometheus's rules.Alert); times are unix seconds, 0 = unset."""

    labels: dict[str, str]
    annotations: dict[str, str]
    value: float
    active_at: float
    state: str = "pending"  # "pending" | "firing" | "inactive" (resolved, kept to be sent as such)
    fired_at: float = 0.0
    resolved_at: float = 0.0
    last_sent_at: float = 0.0
    valid_until: float = 0.0
    keep_firing_since: float = 0.0

    def needs_sending(self, ts: float, resend_delay_s: float) -> bool:
        if self.state == "pending":
            return False
        if self.resolved_at > self.last_sent_at:  # resolved since the last send
            return True
        return self.last_sent_at + resend_delay_s < ts


RESOLVED_RETENTION_S = 15 * 60.0  # a resolved alert is kept (and resent as resolved) this long
ALERTS_METRIC, ALERTS_FOR_STATE_METRIC = "ALERTS", "ALERTS_FOR_STATE"


@dataclass
class AlertingOptions:
    """What alerting rules need beyond their expression: Prometheus's ``--rules.alert.*`` flags,
    ``global.external_labels`` and the external URL (``$externalLabels``, ``$externalURL``, generatorURL)."""

    external_labels: dict[str, str] = field(default_factory=dict)
    external_url: str = ""
    resend_delay_s: float = 60.0
    outage_tolerance_s: float = 3600.0
    grace_period_s: float = 600.0


# notify(expr, alerts): each alert is {"labels", "annotations", "startsAt", "endsAt" (unix seconds),
# "generatorURL"}; called from the evaluation thread, must not block (the notifier queues).
NotifyFunc = Callable[[str, list[dict[str, Any]]], None]
# select(matchers, mint_ms, maxt_ms) -> storage.series_set.SeriesSet, stale markers included.
SelectFunc = Callable[[list[Any], int, int], Any]


class RuleManager:
    def __init__(self, groups: list[Group], engine: Any, append: Callable[[SampleBatch], Any],
                 notify: NotifyFunc | None = None, select: SelectFunc | None = None,
                 options: AlertingOptions | None = None, restore: bool = True):
        self.groups = groups
        self.engine = engine
        self.append = append
        self.notify = notify
        self.select = select
        self.options = options or AlertingOptions()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()  # state read by the API while the evaluation thread writes it
        for g in groups:  # rules loaded at start-up restore their ``for`` state; later ones need not
            g.should_restore = restore and select is not None
            for r in g.rules:
                r.restored = not g.should_restore

    # --- evaluation ------------------------------------------------------------------------
    def eval_group(self, g: Group, ts_ms: int) -> None:
        t0 = time.perf_counter()
        ts = ts_ms / 1000.0
        for r in g.rules:
            r0 = time.perf_counter()
            out: list[tuple[dict[str, str], float]] = []
            try:
                labels, vals = self._instant(r.expr, ts_ms)
                with self._lock:
                    if r.kind == "recording":
                        out = self._recorded(r, labels, vals, g.limit)
                    else:
                        out = self._alerts(r, labels, vals, ts, g.limit)
                r.health, r.last_error = "ok", ""
            except Exception as e:  # noqa: BLE001 - one bad rule must not stop the group
                r.health, r.last_error = "err", str(e)
            failed = r.health == "err"
            self._write(r, out, ts_ms)
            if r.kind == "alerting" and not failed:  # as Prometheus: a failed evaluation sends nothing
                self._send(r, ts, g.interval_s)
            r.last_eval = time.time()
            r.eval_time = time.perf_counter() - r0
        g.last_eval = time.time()
        g.eval_time = time.perf_counter() - t0
        g.evaluations += 1

    def _instant(self, query: str, ts_ms: int) -> tuple[list[Labels], list[float]]:
        return self._vector(self.engine.instant_query(query, ts_ms, QueryOpts(origin="rule")))  # logged as a rule's query

    @staticmethod
    def _vector(res: Any) -> tuple[list[Labels], list[float]]:
        if res.result_type == "scalar":
            return [()], [float(res.scalar)]
        if res.result_type != "vector":
            raise ValueError(f"rule result must be a vector or scalar, got {res.result_type}")
        return list(res.labels), [float(v) for v in res.values]

    @staticmethod
    def _recorded(r: Rule, labels: list[Labels], vals: list[float], limit: int) -> list[tuple[dict[str, str], float]]:
        out, seen = [], set()
        for lbl, v in zip(labels, vals):
            d = dict(lbl)
            d[METRIC_NAME] = r.name
            d.update(r.labels)
            key = make_labels(d)
            if key in seen:
                raise ValueError("vector contains metrics with the same labelset after applying rule labels")
            seen.add(key)
            out.append((d, v))
        if limit > 0 and len(out) > limit:
            raise ValueError(f"exceeded limit of {limit} with {len(out)} series")
        return out

    def _template_ctx(self, ts_ms: int) -> Any:
        from planner.alert_template import Context, Sample

        def query(q: str) -> list[Any]:
            labels, vals = self._instant(q, ts_ms)
            return [Sample(dict(lbl), v) for lbl, v in zip(labels, vals)]

        return Context(query=query, external_url=self.options.external_url)

    def _alerts(self, r: Rule, labels: list[Labels], vals: list[float], ts: float,
                limit: int) -> list[tuple[dict[str, str], float]]:
        """Prometheus's AlertingRule.Eval: new, pending, firing, kept firing and resolved alerts;
        returns the ALERTS / ALERTS_FOR_STATE samples to write."""
        from planner.alert_template import expand

        tctx = self._template_ctx(int(ts * 1000)) if (r.labels or r.annotations) else None
        ext = self.options.external_labels
        found: dict[Labels, Alert] = {}
        for lbl, v in zip(labels, vals):
            sample_labels = dict(lbl)
            d = {k: x for k, x in lbl if k != METRIC_NAME}
            for k, tmpl in r.labels.items():
                d[k] = expand(tmpl, r.name, sample_labels, v, ext, tctx) if "{{" in tmpl else tmpl
            d["alertname"] = r.name
            ann = {k: (expand(t, r.name, sample_labels, v, ext, tctx) if "{{" in t else t)
                   for k, t in sorted(r.annotations.items())}  # sorted by name, as Prometheus's labels.Labels
            key = make_labels({k: x for k, x in d.items() if x != ""})
            if key in found:
                raise ValueError("vector contains metrics with the same labelset after applying alert labels")
            found[key] = Alert(dict(key), ann, v, ts)
        for key, a in found.items():
            old = r.active.get(key)
            if old is not None and old.state != "inactive":
                old.value, old.annotations = a.value, a.annotations
            else:
                r.active[key] = a
        out: list[tuple[dict[str, str], float]] = []
        n_active = 0
        for key, a in list(r.active.items()):
            if key not in found:
                keep = False
                if a.state == "firing" and r.keep_firing_for_s > 0:
                    if not a.keep_firing_since:
                        a.keep_firing_since = ts
                    keep = ts - a.keep_firing_since < r.keep_firing_for_s
                if not keep:
                    if a.state == "pending" or (a.resolved_at and ts - a.resolved_at > RESOLVED_RETENTION_S):
                        del r.active[key]
                    if a.state != "inactive":
                        a.state, a.resolved_at = "inactive", ts
                    continue
            else:
                a.keep_firing_since = 0.0
            n_active += 1
            if a.state == "pending" and ts - a.active_at >= r.for_s:
                a.state, a.fired_at = "firing", ts
            if r.restored:
                out.append(({**a.labels, METRIC_NAME: ALERTS_METRIC, "alertstate": a.state}, 1.0))
                out.append(({**a.labels, METRIC_NAME: ALERTS_FOR_STATE_METRIC}, float(int(a.active_at))))
        if limit > 0 and n_active > limit:
            r.active.clear()
            raise ValueError(f"exceeded limit of {limit} with {n_active} alerts")
        return out

    def _write(self, r: Rule, out: list[tuple[dict[str, str], float]], ts_ms: int) -> None:
        """Append this evaluation's samples and a stale marker for each series of the previous one
        that is gone (as Prometheus's rule group does)."""
        current = {make_labels(d): v for d, v in out}
        gone = [k for k in r.prev_series if k not in current]
        r.prev_series = set(current)
        series = [(k, np.array([ts_ms], np.int64), np.array([v])) for k, v in current.items()]
        series += [(k, np.array([ts_ms], np.int64), np.array([STALE_NAN])) for k in gone]
        if series:
            try:
                self.append(SampleBatch.from_series(series))
            except Exception as e:  # noqa: BLE001 - reported as the rule's error, as Prometheus does
                r.health, r.last_error = "err", f"appending rule results: {e}"

    def _send(self, r: Rule, ts: float, interval_s: float) -> None:
        if self.notify is None:
            return
        delay = self.options.resend_delay_s
        due: list[dict[str, Any]] = []
        with self._lock:
            for a in r.active.values():
                if not a.needs_sending(ts, delay):
                    continue
                a.last_sent_at = ts
                a.valid_until = ts + 4 * max(delay, interval_s)  # allows two failed evaluations or sends
                due.append({"labels": dict(a.labels), "annotations": dict(a.annotations), "startsAt": a.fired_at,
                            "endsAt": a.resolved_at or a.valid_until,
                            "generatorURL": self.options.external_url.rstrip("/") + table_link(r.query)})
        if due:
            self.notify(r.query, due)

    def restore_for_state(self, g: Group, ts: float) -> None:
        """Prometheus's Group.RestoreForState: the activeAt of each active alert of a rule whose
        ``for`` is at least the grace period, from the last ALERTS_FOR_STATE sample within the outage
        tolerance, shifted by the downtime (or to fire one grace period from now)."""
        from storage.matchers import Matcher
        from storage.stale import is_stale_value

        opts = self.options
        for r in g.rules:
            if r.kind != "alerting":
                continue
            if r.for_s < opts.grace_period_s or self.select is None:
                r.restored = True
                continue
            with self._lock:
                for a in r.active.values():
                    want = {**a.labels, METRIC_NAME: ALERTS_FOR_STATE_METRIC}
                    ms = [Matcher(k, "=", v) for k, v in sorted(want.items())]
                    try:
                        ss = self.select(ms, int((ts - opts.outage_tolerance_s) * 1000), int(ts * 1000))
                    except Exception:  # noqa: BLE001 - as Prometheus: log and keep the fresh state
                        log.exception("restoring the for state of alert %s", r.name)
                        continue
                    hit = next((i for i, lbl in enumerate(ss.labels) if len(lbl) == len(want)), None)
                    if hit is None:
                        continue
                    tss, vs = ss.series(hit)
                    if not len(tss) or is_stale_value(float(vs[-1])):
                        continue
                    down_at, restored_at = float(tss[-1] // 1000), float(int(vs[-1]))
                    remaining = r.for_s - (down_at - restored_at)
                    if remaining <= 0:
                        pass  # it was firing when the server went down: fires again at the next evaluation
                    elif remaining < opts.grace_period_s:
                        restored_at = ts + opts.grace_period_s - r.for_s
                    else:
                        restored_at += ts - down_at
                    a.active_at = restored_at
            r.restored = True

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
                    if g.should_restore and g.evaluations >= 2:  # as Prometheus: after the second evaluation
                        self.restore_for_state(g, time.time())
                        g.should_restore = False
                    next_at[id(g)] = now + g.interval_s
            wait = max(0.05, min(next_at.values()) - time.time())
            stop.wait(min(wait, 1.0))

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def replace_groups(self, groups: list[Group], options: AlertingOptions | None = None) -> None:
        """Config reload: evaluate ``groups`` from now on. A rule that is unchanged (same file, group,
        name, expression and labels) keeps its health, last evaluation and active alerts; new rules
        do not restore ``for`` state (as in Prometheus, only the rules loaded at start-up do)."""
        running = self._thread is not None
        self.stop()
        if options is not None:
            self.options = options
        old = {(g.file, g.name, r.kind, r.name, r.expr, tuple(sorted(r.labels.items()))): (g, r)
               for g in self.groups for r in g.rules}
        for g in groups:
            g.should_restore = False
            for r in g.rules:
                r.restored = True
                hit = old.get((g.file, g.name, r.kind, r.name, r.expr, tuple(sorted(r.labels.items()))))
                if hit is not None:
                    prev = hit[1]
                    r.health, r.last_error, r.last_eval, r.eval_time, r.active, r.prev_series, r.restored = \
                        prev.health, prev.last_error, prev.last_eval, prev.eval_time, prev.active, prev.prev_series, \
                        prev.restored
                    g.last_eval, g.eval_time = hit[0].last_eval, hit[0].eval_time
                    g.should_restore = g.should_restore or hit[0].should_restore
        self.groups = groups
        self._stop = threading.Event()
        self._thread = None
        if running or groups:
            self.start()

    # --- API shapes ------------------------------------------------------------------------
    def _rule_json(self, r: Rule) -> dict[str, Any]:
        base: dict[str, Any] = {"name": r.name, "query": r.query, "labels": dict(sorted(r.labels.items())),
                                "health": r.health}
        if r.last_error:
            base["lastError"] = r.last_error
        base.update({"evaluationTime": r.eval_time, "lastEvaluation": _rfc3339(r.last_eval)})
        if r.kind == "recording":
            if not r.labels:
                base.pop("labels")  # omitempty for recording rules only, as Prometheus's JSON
            base["type"] = "recording"
            return base
        states = {a.state for a in r.active.values()}
        state = "firing" if "firing" in states else ("pending" if "pending" in states else "inactive")
        return {"state": state, "name": r.name, "query": r.query, "duration": r.for_s,
                "keepFiringFor": r.keep_firing_for_s, "labels": base["labels"],
                "annotations": dict(sorted(r.annotations.items())),
                "alerts": self._alert_list(r), **{k: v for k, v in base.items() if k not in ("name", "query", "labels")},
                "type": "alerting"}

    @staticmethod
    def _alert_list(r: Rule) -> list[dict[str, Any]]:
        """Active (pending and firing) alerts, as /api/v1/alerts shows them; resolved ones are not."""
        return [{"labels": dict(a.labels), "annotations": dict(a.annotations), "state": a.state,
                 "activeAt": _rfc3339(a.active_at), "value": format_float_e(a.value)}
                for a in r.active.values() if not a.resolved_at]

    def api_groups(self) -> list[dict[str, Any]]:
        with self._lock:
            return [{"name": g.name, "file": g.file, "rules": [self._rule_json(r) for r in g.rules],
                     "interval": g.interval_s, "limit": g.limit, "evaluationTime": g.eval_time,
                     "lastEvaluation": _rfc3339(g.last_eval)} for g in self.groups]

    def api_alerts(self) -> list[dict[str, Any]]:
        with self._lock:
            return [a for g in self.groups for r in g.rules if r.kind == "alerting" for a in self._alert_list(r)]


def table_link(expr: str) -> str:
    """Prometheus's strutil.TableLinkForExpression: the generatorURL path of an alert."""
    import urllib.parse

    return "/graph?g0.expr=" + urllib.parse.quote_plus(expr) + "&g0.tab=1"
