"""Tenant isolation by X-Scope-OrgID through every read endpoint of the real server."""
from __future__ import annotations

import json
import time
import urllib.parse
from pathlib import Path

import numpy as np

from tests.helpers import ServerProcess, http_json


def _req(url: str, tenant: str | None = None, data: bytes | None = None) -> tuple[int, dict]:
    st, body, _ = http_json(url, data, {"X-Scope-OrgID": tenant} if tenant else {}, timeout=30)
    return st, body


def test_tenants_cannot_see_each_other(tmp_path: Path) -> None:
    with ServerProcess(tmp_path / "data", ["--web.enable-admin-api"]) as srv:
        u = srv.url
        now = int(time.time())
        for tenant, val in ((None, 1), ("team-a", 10), ("team-b", 100)):
            body = (f"# TYPE shared_metric gauge\n# HELP shared_metric same name in every tenant\n"
                    f'shared_metric{{pod="p1"}} {val} {now * 1000}\n'
                    f'{(tenant or "default").replace("-", "_")}_only{{pod="p1"}} {val} {now * 1000}\n').encode()
            st, _ = _req(u + "/api/v1/import/prometheus", tenant, body)
            assert st in (200, 204)
        # A default-tenant client cannot write into team-a by sending the reserved label itself.
        _req(u + "/api/v1/import/prometheus", None, f'forged{{__tenant__="team-a"}} 5 {now * 1000}\n'.encode())

        def q(expr: str, tenant: str | None) -> list:
            st, b = _req(u + "/api/v1/query?" + urllib.parse.urlencode({"query": expr, "time": now}), tenant)
            assert st == 200, b
            return b["data"]["result"]

        assert [r["value"][1] for r in q("shared_metric", None)] == ["1"]
        assert [r["value"][1] for r in q("shared_metric", "team-a")] == ["10"]
        assert [r["value"][1] for r in q("sum(shared_metric)", "team-b")] == ["100"]
        assert q("team_a_only", "team-b") == [] and q("team_a_only", None) == []
        assert len(q("team_a_only", "team-a")) == 1
        assert len(q("forged", None)) == 1 and q("forged", "team-a") == []
        for r in q('{__name__=~".+"}', "team-a"):
            assert "__tenant__" not in r["metric"]
        # series / labels / label values / metadata
        st, b = _req(u + "/api/v1/series?match[]=" + urllib.parse.quote('{__name__=~".+_only"}'), "team-a")
        assert [s["__name__"] for s in b["data"]] == ["team_a_only"]
        st, b = _req(u + "/api/v1/label/__name__/values", "team-b")
        assert set(b["data"]) == {"shared_metric", "team_b_only"}
        st, b = _req(u + "/api/v1/labels", "team-b")
        assert "__tenant__" not in b["data"]
        st, b = _req(u + "/api/v1/label/__tenant__/values", None)
        assert b["data"] == []
        st, b = _req(u + "/api/v1/metadata", "team-a")
        assert "team_b_only" not in b["data"] and "default_only" not in b["data"]
        # Range queries too.
        st, b = _req(u + "/api/v1/query_range?" + urllib.parse.urlencode({"query": "shared_metric", "start": now - 60, "end": now, "step": 15}), "team-b")
        assert [s["values"][-1][1] for s in b["data"]["result"]] == ["100"]
        # A malformed tenant id is refused.
        st, b = _req(u + "/api/v1/query?query=1", "bad tenant/x")
        assert st == 400 and "tenant" in b["error"]
        # The cost report and the audit log are scoped to the caller's tenant.
        time.sleep(1.5)
        st, b = _req(u + "/api/v1/cost_report?since=1h", "team-a")
        assert st == 200 and {p["tenant"] for p in b["data"]["patterns"]} <= {"team-a"}
        assert b["data"]["patterns"], "team-a's own queries are reported"
        # team-b proposes an action; the audit log then shows team-b exactly its own entries.
        prop = json.dumps({"verb": "tsdb.delete_series", "target": "tsdb", "params": {"match[]": ["team_b_only"]}}).encode()
        st, b = _req(u + "/api/v1/kedgeflow/propose", "team-b", prop)
        assert st == 200, b
        st, b = _req(u + "/api/v1/audit", "team-b")
        assert st == 200 and b["data"] and {e["tenant"] for e in b["data"]} == {"team-b"}
        st, b = _req(u + "/api/v1/audit", None)
        assert all(e["tenant"] == "default" for e in b["data"])
        # status/tsdb is scoped too: team-a's cardinality shows none of the others' metric names.
        st, b = _req(u + "/api/v1/status/tsdb", "team-a")
        names = {x["name"] for x in b["data"]["seriesCountByMetricName"]}
        assert names == {"shared_metric", "team_a_only"}, names
        # A delete by team-a cannot touch another tenant's series of the same name.
        st, _ = _req(u + "/api/v1/admin/tsdb/delete_series?match[]=shared_metric", "team-a", b"")
        assert st == 204
        assert q("shared_metric", "team-a") == []
        assert [r["value"][1] for r in q("shared_metric", None)] == ["1"]
        assert [r["value"][1] for r in q("shared_metric", "team-b")] == ["100"]


def test_summaries_and_congestion_only_see_the_default_tenant(tmp_path: Path) -> None:
    """Other tenants' samples never reach the ingest sinks (the operator's summaries and congestion
    signals), including sinks attached after wiring; metadata is kept per tenant."""
    from storage.batch import MetricMetadata, SampleBatch
    from storage.labels import make_labels
    from turboprom.config import ServerConfig
    from turboprom.server import create_app
    from turboprom.tenancy import label_batch
    from turboprom.wiring import build_context

    class Recorder:  # a late-attached sink, recording what reaches it
        def __init__(self) -> None:
            self.tenants: list[str] = []

        def consume(self, batch: SampleBatch) -> None:
            self.tenants.append(batch.tenant)

    ctx = build_context(ServerConfig(data_dir=str(tmp_path / "d")))
    try:
        create_app(ctx)
        pipeline = ctx.components.ingest
        assert pipeline.sink_tenants == {"default"}
        assert {type(s).__name__ for s in pipeline.sinks} >= {"CongestionTracker", "Summarizer"}
        assert len(pipeline.sinks) == len(set(map(id, pipeline.sinks)))  # the tracker is attached once
        rec = Recorder()
        pipeline.add_sink(rec)
        now = int(time.time() * 1000)
        for tenant, help_text in (("default", "ops help"), ("team-a", "team-a help")):
            b = SampleBatch([make_labels({"__name__": "m_total"})], np.zeros(1, np.int64), np.array([now], np.int64),
                            np.ones(1), metadata=[MetricMetadata("m_total", "counter", help_text)], tenant=tenant)
            res = pipeline.append_sync(label_batch(b, tenant) if tenant != "default" else b)
            assert res.accepted == 1
        assert rec.tenants == ["default"]
        md = ctx.components.metadata
        assert md.get("m_total") == {"m_total": [{"type": "counter", "help": "ops help", "unit": ""}]}
        assert md.get("m_total", tenant="team-a") == {"m_total": [{"type": "counter", "help": "team-a help", "unit": ""}]}
    finally:
        ctx.storage.close()
