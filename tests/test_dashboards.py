"""Every panel of the bundled Grafana dashboards returns data against a demo-populated server:
the real server scraping a live simulated fleet (real exporters, Vesta polling the congestion API)."""
from __future__ import annotations

import json
import re
import urllib.error
import time
import urllib.parse
import urllib.request
from pathlib import Path

import yaml

from scheduler_metrics.sim.demo_fleet import DemoFleet
from tests.helpers import SHARED, ServerProcess, held_port
from turboprom.dashboards import DASHBOARDS, grafana_json
from turboprom.demo import demo_config, demo_grant_key_pem
from turboprom.demo_workload import DashboardWorkload


def _query_range(url: str, expr: str, now: float) -> list:
    q = urllib.parse.urlencode({"query": expr, "start": now - 600, "end": now, "step": 5})
    with urllib.request.urlopen(url + "/api/v1/query_range?" + q, timeout=60) as r:
        body = json.loads(r.read())
    assert body["status"] == "success", (expr, body)
    return body["data"]["result"]


def test_every_dashboard_panel_returns_data(tmp_path: Path) -> None:
    with held_port() as port:  # the fleet's exporters get other ports
        base = f"http://127.0.0.1:{port}"
        # the demo as `make demo` wires it, KedgeFlow control loop included
        fleet = DemoFleet(base, str(SHARED / "traces" / "mooncake_conversation_trace.jsonl"), instances=4, load=0.8, speed=4.0,
                          limit=1500, control_key_pem=demo_grant_key_pem(tmp_path / "data"))
    cfg = tmp_path / "demo.yml"
    raw = demo_config(f"127.0.0.1:{port}", fleet.targets, f"127.0.0.1:{fleet.sched_port}", fleet.control_url)
    raw["scrape_configs"][0]["scrape_interval"] = "2s"
    cfg.write_text(yaml.safe_dump(raw))
    with ServerProcess(tmp_path / "data", ["--config", str(cfg)], port=port) as srv:
        fleet.start()
        try:
            # One out-of-order sample, as any real deployment sees: the rejections panel has something to show.
            now_ms = int(time.time() * 1000)
            for body in (f"late_metric 1 {now_ms}\n", f"late_metric 2 {now_ms - 3_600_000}\n"):
                try:
                    urllib.request.urlopen(urllib.request.Request(srv.url + "/api/v1/import/prometheus", data=body.encode(), method="POST"), timeout=10)
                except urllib.error.HTTPError:
                    pass
            wl = DashboardWorkload(srv.url, range_s=600, step_s=5)
            deadline = time.time() + 150
            missing: list[str] = []
            while time.time() < deadline:
                wl.run_once()
                now = time.time()
                missing = [f"{d.uid}: {p.title}: {q}" for d in DASHBOARDS for p in d.panels for q in p.queries()
                           if not _query_range(srv.url, q, now)]
                if not missing and fleet.completed > 50:
                    break
                time.sleep(5)
            assert not missing, "panels without data:\n" + "\n".join(missing)
            assert wl.errors == 0
        finally:
            fleet.stop()


def test_dashboard_json_matches_the_definitions() -> None:
    for d in DASHBOARDS:
        on_disk = json.loads((Path(__file__).resolve().parent.parent / "docs" / "grafana" / f"{d.uid}.json").read_text())
        assert on_disk == json.loads(json.dumps(grafana_json(d))), f"regenerate docs/grafana with python -m turboprom.dashboards ({d.uid})"


# Grafana's built-in variables a panel query may use (public/app/features/variables: __interval,
# __rate_interval, __range and friends are interpolated by Grafana itself, never defined by a dashboard).
GRAFANA_BUILTINS = {"__interval", "__interval_ms", "__rate_interval", "__range", "__range_s", "__range_ms"}


# What Grafana checks when a dashboard is imported, provisioned from a file or saved, read from its
# repository (github:grafana/grafana):
# * pkg/services/dashboards/service/dashboard_service.go (BuildSaveDashboardCommand): the title,
#   trimmed, may not be empty ("Dashboard title cannot be empty"); the uid must match
#   ``^[a-zA-Z0-9\-\_]*$`` (pkg/util/shortid_generator.go, "uid contains illegal characters") and be
#   at most 40 characters ("uid too long, max 40 characters"); a ``refresh`` other than "" / "auto"
#   must parse as a duration no shorter than ``min_refresh_interval`` (conf/defaults.ini: 5s;
#   "Dashboard refresh interval is too low").
# * kinds/dashboard/dashboard_kind.cue (the dashboard schema): the types of the top-level fields
#   (``style`` light|dark, ``graphTooltip`` 0|1|2, ``time.from``/``to`` strings, ``refresh`` string or
#   false, ``schemaVersion`` uint16, ``version`` uint32, ``tags`` strings); template variables
#   (#VariableModel: ``type`` one of query|adhoc|constant|datasource|interval|textbox|custom|system,
#   ``name`` a string, ``hide`` 0|1|2, ``query`` string or object, ``datasource`` {type?, uid?});
#   panels (#Panel: ``type`` a non-empty plugin id, ``id`` uint32, ``targets`` objects, ``datasource``
#   {type?, uid?}, #GridPos ``h`` > 0, 0 < ``w`` <= 24, 0 <= ``x`` < 24, ``y`` >= 0, ``repeatDirection``
#   h|v, ``transformations`` [{id}], ``options`` an object, #FieldConfigSource ``defaults`` with
#   ``unit`` string, ``decimals``/``min``/``max`` numbers, ``thresholds`` {mode absolute|percentage,
#   steps [{color, value?}]}, ``overrides`` [{matcher {id}, properties [{id}]}]).
# * the panel plugin must exist: Grafana's built-in panels are public/app/plugins/panel/<id>/.
GRAFANA_UID = re.compile(r"^[a-zA-Z0-9\-_]*$")
GRAFANA_VARIABLE_TYPES = {"query", "adhoc", "constant", "datasource", "interval", "textbox", "custom", "system"}
GRAFANA_BUILTIN_PANELS = {"timeseries", "stat", "gauge", "bargauge", "table", "text", "heatmap", "piechart", "barchart",
                          "histogram", "state-timeline", "status-history", "row"}
GRAFANA_MIN_REFRESH_S = 5.0
GRAFANA_TIME = re.compile(r"^now(-\d+[smhdwMy])?(/[smhdwMy])?$")
_GRAFANA_DURATION = re.compile(r"^(\d+)(ms|s|m|h|d|w|M|y)$")
_UNIT_S = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "M": 2592000, "y": 31536000}


def _uint(v: object, bits: int) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**bits


def _number(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _ds_ref(v: object) -> bool:
    return isinstance(v, dict) and all(isinstance(v.get(k, ""), str) for k in ("type", "uid"))


def grafana_import_problems(j: dict) -> list[str]:
    """What Grafana would refuse or fail to read in dashboard JSON ``j`` (the rules listed above)."""
    out: list[str] = []
    title, uid = j.get("title"), j.get("uid", "")
    if not isinstance(title, str) or not title.strip():
        out.append("Dashboard title cannot be empty")
    if not isinstance(uid, str) or not GRAFANA_UID.match(uid):
        out.append(f"uid {uid!r} contains illegal characters")
    elif len(uid) > 40:
        out.append(f"uid {uid!r} too long, max 40 characters")
    refresh = j.get("refresh", "")
    if refresh is not False and refresh not in ("", "auto"):
        m = _GRAFANA_DURATION.match(refresh) if isinstance(refresh, str) else None
        if m is None:
            out.append(f"refresh {refresh!r} is not a duration")
        elif int(m[1]) * _UNIT_S[m[2]] < GRAFANA_MIN_REFRESH_S:
            out.append(f"refresh {refresh!r}: Dashboard refresh interval is too low (min {GRAFANA_MIN_REFRESH_S:g}s)")
    if j.get("style", "dark") not in ("light", "dark"):
        out.append(f"style {j['style']!r} is not light or dark")
    if j.get("graphTooltip", 0) not in (0, 1, 2):
        out.append(f"graphTooltip {j['graphTooltip']!r} is not 0, 1 or 2")
    if not isinstance(j.get("editable", True), bool):
        out.append("editable is not a boolean")
    if not _uint(j.get("schemaVersion"), 16):
        out.append(f"schemaVersion {j.get('schemaVersion')!r} is not a uint16")
    if "version" in j and not _uint(j["version"], 32):
        out.append(f"version {j['version']!r} is not a uint32")
    if not isinstance(j.get("tags", []), list) or not all(isinstance(t, str) for t in j.get("tags", [])):
        out.append("tags are not a list of strings")
    t = j.get("time", {"from": "now-6h", "to": "now"})
    if not isinstance(t, dict) or not all(isinstance(t.get(k), str) and GRAFANA_TIME.match(t[k]) for k in ("from", "to")):
        out.append(f"time {t!r} is not {{from, to}} relative time strings")
    for v in (j.get("templating") or {}).get("list", []):
        name = v.get("name")
        if not isinstance(name, str) or not name:
            out.append(f"variable without a name: {v}")
        if v.get("type") not in GRAFANA_VARIABLE_TYPES:
            out.append(f"variable {name}: type {v.get('type')!r} is not one of {sorted(GRAFANA_VARIABLE_TYPES)}")
        if v.get("hide", 0) not in (0, 1, 2):
            out.append(f"variable {name}: hide {v['hide']!r} is not 0, 1 or 2")
        if not isinstance(v.get("query", ""), (str, dict)):
            out.append(f"variable {name}: query is neither a string nor an object")
        if "datasource" in v and not _ds_ref(v["datasource"]):
            out.append(f"variable {name}: datasource is not {{type, uid}}")
    for p in j.get("panels", []):
        where = f"panel {p.get('title', p.get('id'))!r}"
        if not isinstance(p.get("type"), str) or not p["type"]:
            out.append(f"{where}: panel plugin type may not be empty")
        elif p["type"] not in GRAFANA_BUILTIN_PANELS:
            out.append(f"{where}: panel plugin {p['type']!r} is not one of Grafana's built-in panels")
        if "id" in p and not _uint(p["id"], 32):
            out.append(f"{where}: id {p['id']!r} is not a uint32")
        if not isinstance(p.get("title", ""), str) or not isinstance(p.get("transparent", False), bool):
            out.append(f"{where}: title is not a string or transparent not a boolean")
        if "datasource" in p and not _ds_ref(p["datasource"]):
            out.append(f"{where}: datasource is not {{type, uid}}")
        g = p.get("gridPos", {})
        if not (_uint(g.get("h", 9), 32) and g.get("h", 9) > 0 and _uint(g.get("w", 12), 32) and 0 < g.get("w", 12) <= 24
                and _uint(g.get("x", 0), 32) and g.get("x", 0) < 24 and _uint(g.get("y", 0), 32)):
            out.append(f"{where}: gridPos {g} outside h > 0, 0 < w <= 24, 0 <= x < 24, y >= 0")
        if p.get("repeatDirection", "h") not in ("h", "v"):
            out.append(f"{where}: repeatDirection {p['repeatDirection']!r} is not h or v")
        for k in ("interval", "timeFrom", "timeShift", "pluginVersion"):
            if k in p and not isinstance(p[k], str):
                out.append(f"{where}: {k} is not a string")
        if "maxDataPoints" in p and not _number(p["maxDataPoints"]):
            out.append(f"{where}: maxDataPoints is not a number")
        if not isinstance(p.get("options", {}), dict):
            out.append(f"{where}: options is not an object")
        if not all(isinstance(x, dict) and isinstance(x.get("id"), str) for x in p.get("transformations", [])):
            out.append(f"{where}: a transformation has no id")
        if not all(isinstance(x, dict) for x in p.get("targets", [])):
            out.append(f"{where}: a target is not an object")
        fc = p.get("fieldConfig", {"defaults": {}, "overrides": []})
        d = fc.get("defaults", {}) if isinstance(fc, dict) else None
        if not isinstance(d, dict):
            out.append(f"{where}: fieldConfig.defaults is not an object")
            continue
        if "unit" in d and not isinstance(d["unit"], str):
            out.append(f"{where}: unit is not a string")
        for k in ("decimals", "min", "max"):
            if k in d and not _number(d[k]):
                out.append(f"{where}: {k} is not a number")
        th = d.get("thresholds")
        if th is not None and not (isinstance(th, dict) and th.get("mode") in ("absolute", "percentage")
                                   and all(isinstance(s.get("color"), str) and (s.get("value") is None or _number(s["value"]))
                                           for s in th.get("steps", []))):
            out.append(f"{where}: thresholds are not {{mode absolute|percentage, steps [{{color, value}}]}}")
        if "color" in d and not (isinstance(d["color"], dict) and isinstance(d["color"].get("mode"), str)):
            out.append(f"{where}: color has no mode")
        if "custom" in d and not isinstance(d["custom"], dict):
            out.append(f"{where}: custom is not an object")
        for o in fc.get("overrides", []):
            if not (isinstance(o.get("matcher"), dict) and isinstance(o["matcher"].get("id", ""), str)
                    and all(isinstance(x.get("id", ""), str) for x in o.get("properties", []))):
                out.append(f"{where}: override {o} is not {{matcher {{id}}, properties [{{id}}]}}")
    return out


def test_grafana_import_rules_refuse_what_grafana_refuses() -> None:
    """The checker is not vacuous: each rule flags a dashboard Grafana would refuse or misread."""
    good = grafana_json(DASHBOARDS[0])
    assert grafana_import_problems(good) == []

    def broken(change) -> list[str]:
        j = json.loads(json.dumps(good))
        change(j)
        return grafana_import_problems(j)

    cases = {
        "title cannot be empty": lambda j: j.update(title="  "),
        "illegal characters": lambda j: j.update(uid="a/b"),
        "too long": lambda j: j.update(uid="x" * 41),
        "refresh interval is too low": lambda j: j.update(refresh="1s"),
        "not a duration": lambda j: j.update(refresh="soon"),
        "schemaVersion": lambda j: j.update(schemaVersion="39"),
        "relative time strings": lambda j: j.update(time={"from": "yesterday", "to": "now"}),
        "type 'select'": lambda j: j["templating"]["list"][1].update(type="select"),
        "hide 3": lambda j: j["templating"]["list"][1].update(hide=3),
        "may not be empty": lambda j: j["panels"][0].update(type=""),
        "built-in panels": lambda j: j["panels"][0].update(type="graph2"),
        "gridPos": lambda j: j["panels"][0]["gridPos"].update(w=25),
        "is not a uint32": lambda j: j["panels"][0].update(id=-1),
        "unit is not a string": lambda j: j["panels"][0]["fieldConfig"]["defaults"].update(unit=1),
        "thresholds": lambda j: j["panels"][0]["fieldConfig"]["defaults"].update(thresholds={"mode": "relative", "steps": []}),
        "datasource is not": lambda j: j["panels"][0].update(datasource={"uid": 5}),
    }
    for needle, change in cases.items():
        problems = broken(change)
        assert any(needle in p for p in problems), (needle, problems)


def test_dashboards_follow_grafanas_import_rules() -> None:
    """What Grafana's dashboard import and file provisioning check or need (schemaVersion 39 dashboards):
    a unique ``uid`` of at most 40 characters, unique panel ids, ``gridPos`` inside the 24-column grid
    without overlaps, every ``$variable`` and ``${datasource}`` defined in ``templating.list`` (file
    provisioning does not resolve ``__inputs``, so there must be none and no ``${DS_...}`` left), a
    ``datasource``-type variable for the Prometheus plugin, unique refIds per panel, and every target
    query a valid PromQL expression once Grafana has interpolated it (checked by the server's parser)."""
    from turboprom.dashboards import FLEET_VARIABLES, expand, variables_in
    from promql.engine import parse

    uids = [d.uid for d in DASHBOARDS]
    assert len(set(uids)) == len(uids)
    files = sorted((Path(__file__).resolve().parent.parent / "docs" / "grafana").glob("*.json"))
    assert len(files) == len(DASHBOARDS)
    for f in files:  # the files as shipped
        assert grafana_import_problems(json.loads(f.read_text())) == [], f.name
    for d in DASHBOARDS:
        j = grafana_json(d)
        text = json.dumps(j)
        assert "__inputs" not in j and "${DS_" not in text, d.uid
        assert len(j["uid"]) <= 40 and isinstance(j["schemaVersion"], int)
        names = [v["name"] for v in j["templating"]["list"]]
        assert len(set(names)) == len(names)
        assert {"name": "datasource", "type": "datasource", "query": "prometheus"}.items() <= j["templating"]["list"][0].items()
        defined = set(names) | GRAFANA_BUILTINS
        ids = [p["id"] for p in j["panels"]]
        assert len(set(ids)) == len(ids)
        cells: set[tuple[int, int]] = set()
        for p in j["panels"]:
            g = p["gridPos"]
            assert 0 <= g["x"] and g["x"] + g["w"] <= 24 and g["h"] > 0 and g["y"] >= 0, (d.uid, p["title"])
            mine = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
            assert not mine & cells, f"{d.uid}: panel {p['title']!r} overlaps another"
            cells |= mine
            assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
            refs = [t["refId"] for t in p["targets"]]
            assert len(set(refs)) == len(refs) and refs
            for t in p["targets"]:
                assert variables_in(t["expr"]) <= defined, (d.uid, t["expr"])
                assert "[1m]" not in t["expr"] and "[5m]" not in t["expr"], f"fixed rate window in {t['expr']}"
                parse(expand(t["expr"]))
        for v in j["templating"]["list"][1:]:
            assert v["name"] in FLEET_VARIABLES and v["allValue"] == ".*"
            assert variables_in(v["query"]["query"]) <= defined


def _instant(url: str, expr: str) -> list:
    q = urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url + "/api/v1/query?" + q, timeout=60) as r:
        body = json.loads(r.read())
    assert body["status"] == "success", (expr, body)
    return body["data"]["result"]


def test_demo_history_is_continued_by_the_live_scrape(tmp_path: Path) -> None:
    """The demo writes fleet history before its exporters serve: the live scrape then continues the very
    same series (no second copy of any series, nothing refused as out of order), and hour-long panels
    have an hour of data from the start."""
    from turboprom.demo_history import write_history

    with held_port() as port:  # the fleet's exporters get other ports
        base = f"http://127.0.0.1:{port}"
        fleet = DemoFleet(base, str(SHARED / "traces" / "mooncake_conversation_trace.jsonl"), instances=2, load=0.8, speed=4.0,
                          limit=300)
    cfg = tmp_path / "demo.yml"
    raw = demo_config(f"127.0.0.1:{port}", fleet.targets, f"127.0.0.1:{fleet.sched_port}")
    cfg.write_text(yaml.safe_dump(raw))
    with ServerProcess(tmp_path / "data", ["--config", str(cfg)], port=port) as srv:
        time.sleep(2.5)  # scrapes of the fleet fail until it serves: nothing of it is stored yet
        assert not _instant(srv.url, "vllm:num_requests_waiting")
        n = write_history(srv.url, fleet.workers, scheduler=fleet.sched_metrics, hours=1.0)
        assert n > 10_000
        hist = {json.dumps(s["metric"], sort_keys=True) for s in _instant(srv.url, "vllm:num_requests_waiting")}
        assert len(hist) == 2
        fleet.start()
        try:
            deadline = time.time() + 60
            while time.time() < deadline:
                live = _instant(srv.url, "count_over_time(vllm:num_requests_waiting[3s])")
                if len(live) == 2:
                    break
                time.sleep(1)
            series = {json.dumps(s["metric"], sort_keys=True) for s in _instant(srv.url, "vllm:num_requests_waiting")}
            assert series == hist, (series, hist)  # the live scrape continues the history's series
            n_hour = _instant(srv.url, "count_over_time(vllm:num_requests_waiting[1h])")
            assert len(n_hour) == 2 and all(float(s["value"][1]) >= 230 for s in n_hour), n_hour
            rejected = _instant(srv.url, 'sum(turboprom_storage_rejected_samples_total{reason=~"out_of_order|too_old"})')
            assert not rejected or float(rejected[0]["value"][1]) == 0, rejected
            ttft = _instant(srv.url, "histogram_quantile(0.99, sum by (le) (rate(vllm:time_to_first_token_seconds_bucket[30m] offset 10m)))")
            assert ttft and 0 < float(ttft[0]["value"][1]) < 30, ttft
        finally:
            fleet.stop()
