"""Alerting-rule state over chosen evaluation times (planner/rules.py on the real storage and PromQL
engine): when an alert is sent, resent and resolved (resend delay, 15 min retention of resolved
alerts, endsAt), keep_firing_for, the ALERTS / ALERTS_FOR_STATE series with their stale markers, and
rule errors (duplicate label sets, the group limit). Intervals of minutes are evaluated in a few ms
here; tests/test_alert_delivery.py checks the same semantics against Prometheus in real time."""
from __future__ import annotations

import numpy as np
import pytest

from planner.rules import AlertingOptions, Group, Rule, RuleManager
from promql.engine import Engine
from storage.batch import SampleBatch
from storage.labels import make_labels
from storage.matchers import Matcher
from storage.stale import is_stale
from storage.tsdb import TSDB
from turboprom.tenancy import DEFAULT_TENANT, TenantView

T0 = 1_700_000_000_000  # ms


@pytest.fixture
def db(tmp_path):
    d = TSDB(str(tmp_path / "db"), background=False)
    yield d
    d.close()


def write(db: TSDB, name: str, labels: dict[str, str], points: list[tuple[int, float]]) -> None:
    db.append(SampleBatch.from_series([(make_labels({"__name__": name, **labels}),
                                        np.array([t for t, _ in points]), np.array([v for _, v in points]))]))


def manager(db: TSDB, rules: list[Rule], limit: int = 0, restore: bool = False, **opts) -> tuple[RuleManager, list]:
    sent: list[tuple[str, list[dict]]] = []
    view = TenantView(db, DEFAULT_TENANT)
    g = Group("g", "rules.yml", 60.0, rules, limit)
    mgr = RuleManager([g], Engine(view), db.append, notify=lambda expr, alerts: sent.append((expr, alerts)),
                      select=view.select, options=AlertingOptions(external_url="http://tp:9090", **opts),
                      restore=restore)
    return mgr, sent


def series(db: TSDB, name: str) -> dict[tuple, tuple[np.ndarray, np.ndarray]]:
    ss = db.select([Matcher("__name__", "=", name)], 0, 2**62)
    return {lbl: ss.series(i) for i, lbl in enumerate(ss.labels)}


def test_sends_resends_resolves_and_forgets(db):
    minute = 60_000
    write(db, "up", {"job": "a"}, [(T0 + k * minute, 0.0 if k < 4 else 1.0) for k in range(40)])
    mgr, sent = manager(db, [Rule("Down", "up == 0", "alerting", {"sev": "page"}, {"s": "{{ $labels.job }} down"},
                                  for_s=120.0)])
    g = mgr.groups[0]
    for k in range(3):
        mgr.eval_group(g, T0 + k * minute)
    # pending at 0 and 1 min (nothing sent), firing at 2 min: sent with startsAt = firing time.
    assert len(sent) == 1
    expr, [a] = sent[0]
    assert expr == "up == 0"
    assert a["labels"] == {"alertname": "Down", "job": "a", "sev": "page"}
    assert a["annotations"] == {"s": "a down"}
    assert a["startsAt"] == (T0 + 2 * minute) / 1000
    assert a["endsAt"] == (T0 + 2 * minute) / 1000 + 4 * 60  # 4 x max(resend delay 1m, interval 1m)
    assert a["generatorURL"] == "http://tp:9090/graph?g0.expr=up+%3D%3D+0&g0.tab=1"
    mgr.eval_group(g, T0 + 3 * minute)  # exactly one resend delay later: not yet (Prometheus: strictly after)
    assert len(sent) == 1
    mgr.eval_group(g, T0 + 3 * minute + 1)
    assert len(sent) == 2
    # resolved at 4 min: sent at once with endsAt = resolution time, then every resend delay ...
    mgr.eval_group(g, T0 + 4 * minute)
    assert len(sent) == 3 and sent[2][1][0]["endsAt"] == (T0 + 4 * minute) / 1000
    assert mgr.api_alerts() == []  # resolved alerts are not listed
    assert mgr.api_groups()[0]["rules"][0]["state"] == "inactive"
    resent = []
    for k in range(5, 25):
        before = len(sent)
        mgr.eval_group(g, T0 + k * minute + 1)
        if len(sent) > before:
            resent.append(k)
    # Resent when the last send is more than one resend delay old (every other 1-minute evaluation),
    # all resolved at 4 min, and forgotten once resolved for more than 15 minutes (at 19 min + 1 ms).
    assert resent == [5, 7, 9, 11, 13, 15, 17]
    assert {a["endsAt"] for _, al in sent[2:] for a in al} == {(T0 + 4 * minute) / 1000}
    assert g.rules[0].active == {}


def test_keep_firing_for_and_alerts_series(db):
    s = 1000
    write(db, "q", {"i": "1"}, [(T0 + k * s, 5.0 if k < 3 else 0.0) for k in range(20)])
    mgr, sent = manager(db, [Rule("Q", "q > 3", "alerting", keep_firing_for_s=4.0)], restore=True)
    g = mgr.groups[0]
    for k in range(12):
        mgr.eval_group(g, T0 + k * s)
        if g.should_restore and g.evaluations >= 2:
            mgr.restore_for_state(g, (T0 + k * s) / 1000)
            g.should_restore = False
    horizon = (T0 + 20 * s) / 1000
    firing = [a for _, al in sent for a in al if a["endsAt"] > horizon]
    assert firing and firing[0]["startsAt"] == T0 / 1000  # no 'for': fires at the first evaluation
    resolved = [a for _, al in sent for a in al if a["endsAt"] <= horizon]
    # Condition false from 3 s on; kept firing while now - 3 s < 4 s: resolved at 7 s.
    assert resolved and resolved[0]["endsAt"] == (T0 + 7 * s) / 1000
    alerts = series(db, "ALERTS")
    key = make_labels({"__name__": "ALERTS", "alertname": "Q", "alertstate": "firing", "i": "1"})
    ts, vs = alerts[key]
    # Written once restored (after the second evaluation), a stale marker when the alert is gone.
    assert ts[0] == T0 + 2 * s and list(vs[:-1]) == [1.0] * (len(vs) - 1) and is_stale(vs[-1:])[0]
    assert ts[-1] == T0 + 7 * s
    fs_ts, fs_vs = series(db, "ALERTS_FOR_STATE")[make_labels({"__name__": "ALERTS_FOR_STATE", "alertname": "Q",
                                                                "i": "1"})]
    assert list(fs_vs[:-1]) == [T0 / 1000] * (len(fs_vs) - 1)


def test_rule_errors(db):
    write(db, "m", {"a": "1", "b": "x"}, [(T0, 1.0)])
    write(db, "m", {"a": "2", "b": "x"}, [(T0, 1.0)])
    mgr, sent = manager(db, [Rule("Dup", "m", "alerting", {"a": "same"}), Rule("Many", "m", "alerting")], limit=1)
    mgr.eval_group(mgr.groups[0], T0)
    dup, many = mgr.api_groups()[0]["rules"]
    assert dup["health"] == "err"
    assert dup["lastError"] == "vector contains metrics with the same labelset after applying alert labels"
    assert many["health"] == "err" and many["lastError"] == "exceeded limit of 1 with 2 alerts"
    assert sent == []
    assert sorted(dup) == sorted(["state", "name", "query", "duration", "keepFiringFor", "labels", "annotations",
                                  "alerts", "health", "lastError", "evaluationTime", "lastEvaluation", "type"])
