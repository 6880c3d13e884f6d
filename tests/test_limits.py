"""Input limits and per-tenant limits against the real server (config `limits:` section)."""
from __future__ import annotations

import threading
import time
import urllib.parse
from pathlib import Path

from tests.helpers import ServerProcess, http_json

CFG = """
limits:
  max_labels_per_series: 6
  max_label_value_length: 40
  max_query_length: 200
  tenants:
    slow-writer: {ingestion_rate_samples_per_second: 5}
    small: {max_active_series: 3, max_samples_per_query: 50}
    one-at-a-time: {max_concurrent_queries: 1}
"""


def _req(url: str, tenant: str | None = None, data: bytes | None = None) -> tuple[int, dict, dict]:
    return http_json(url, data, {"X-Scope-OrgID": tenant} if tenant else {})


def test_openmetrics_import_admits_each_series_once_and_never_remembers_a_refused_one(tmp_path: Path) -> None:
    """The same admission for bodies the compiled text walk does not take (OpenMetrics): series found
    by their labels once admitted, a refused request's series unknown again."""
    cfg = tmp_path / "cfg.yml"
    cfg.write_text(CFG)
    om = {"X-Scope-OrgID": "small", "Content-Type": "application/openmetrics-text; version=1.0.0"}
    with ServerProcess(tmp_path / "data", ["--config", str(cfg)]) as srv:
        imp = srv.url + "/api/v1/import/prometheus"

        def send(ks: str, v: int) -> tuple[int, dict]:
            body = "".join(f's{{k="{k}"}} {v}\n' for k in ks) + "# EOF\n"
            st, b, _ = http_json(imp, body.encode(), om)
            return st, b

        assert send("12", 1)[0] == 204
        for _ in range(2):
            st, b = send("34", 1)
            assert st == 429 and "active series" in b["error"], b
        assert send("3", 2)[0] == 204
        assert send("4", 2)[0] == 429
        assert send("123", 3)[0] == 204  # all known
        st, b, _ = _req(srv.url + "/api/v1/query?" + urllib.parse.urlencode({"query": "s"}), "small")
        assert st == 200 and sorted((r["metric"]["k"], r["value"][1]) for r in b["data"]["result"]) == \
            [("1", "3"), ("2", "3"), ("3", "3")], b


def test_input_and_tenant_limits(tmp_path: Path) -> None:
    cfg = tmp_path / "cfg.yml"
    cfg.write_text(CFG)
    with ServerProcess(tmp_path / "data", ["--config", str(cfg)]) as srv:
        imp = srv.url + "/api/v1/import/prometheus"
        st, b, _ = _req(imp, None, b'm{a="1",b="2",c="3",d="4",e="5",f="6",g="7"} 1\n')
        assert st == 400 and "max_labels_per_series" in b["error"]
        st, b, _ = _req(imp, None, ('m{a="' + "x" * 41 + '"} 1\n').encode())
        assert st == 400 and "max_label_value_length" in b["error"]
        st, b, _ = _req(srv.url + "/api/v1/query?" + urllib.parse.urlencode({"query": "1" + "+1" * 150}))
        assert st == 400 and "max_query_length" in b["error"]
        # Rate limit: a 5 samples/s tenant (burst 10): a 150-sample batch passes on a full bucket, then 429
        # + Retry-After until 150 tokens have refilled (30 s), however slow the machine.
        body = "".join(f'r{{k="{i}"}} 1\n' for i in range(150)).encode()
        codes = [_req(imp, "slow-writer", body) for _ in range(3)]
        assert codes[0][0] == 204 and codes[-1][0] == 429 and codes[-1][2].get("Retry-After")
        assert "ingestion rate limit" in codes[-1][1]["error"]
        # Active series limit.
        now = int(time.time())
        lines = "".join(f's{{k="1"}} {i} {(now - 3000 + i * 10) * 1000}\n' for i in range(100)).encode()
        assert _req(imp, "small", lines)[0] == 204
        assert _req(imp, "small", b's{k="1"} 1\ns{k="2"} 1\n')[0] == 204
        st, b, _ = _req(imp, "small", b's{k="3"} 1\ns{k="4"} 1\n')
        assert st == 429 and "active series" in b["error"]
        assert _req(imp, "small", b's{k="1"} 2\n')[0] == 204  # known series still accepted
        # Samples per query.
        st, b, _ = _req(srv.url + "/api/v1/query?" + urllib.parse.urlencode({"query": 'count_over_time(s{k="1"}[1h])', "time": now}), "small")
        assert st == 422 and "too many samples" in b["error"]
        # Other tenants are not affected by these per-tenant limits.
        assert _req(imp, "someone-else", body)[0] == 204
        # Concurrent queries: one at a time for this tenant.
        many = "".join(f'c{{k="{i}"}} {j} {(now - 3600 + j * 15) * 1000}\n' for i in range(300) for j in range(240)).encode()
        assert _req(imp, "one-at-a-time", many)[0] == 204
        q = srv.url + "/api/v1/query_range?" + urllib.parse.urlencode(
            {"query": "quantile_over_time(0.9, c[30m])", "start": now - 3600, "end": now, "step": 15})
        results: list[int] = []

        def go() -> None:
            results.append(_req(q, "one-at-a-time")[0])

        ts = [threading.Thread(target=go) for _ in range(4)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(120)
        assert 200 in results and 429 in results, results


def test_import_admits_each_series_once_and_never_remembers_a_refused_one(tmp_path: Path) -> None:
    """The import endpoint checks a series' tenant label and input limits when it first sees it and
    keeps the result; a request the tenant's limits refuse leaves its new series unknown, so they
    count against the active-series limit again when they come back."""
    cfg = tmp_path / "cfg.yml"
    cfg.write_text(CFG)
    with ServerProcess(tmp_path / "data", ["--config", str(cfg)]) as srv:
        imp = srv.url + "/api/v1/import/prometheus"
        assert _req(imp, "small", b's{k="1"} 1\ns{k="2"} 1\n')[0] == 204
        for _ in range(2):  # refused twice: the first refusal did not admit k=3 / k=4
            st, b, _ = _req(imp, "small", b's{k="3"} 1\ns{k="4"} 1\n')
            assert st == 429 and "active series" in b["error"], b
        assert _req(imp, "small", b's{k="3"} 2\n')[0] == 204
        assert _req(imp, "small", b's{k="4"} 2\n')[0] == 429
        assert _req(imp, "small", b's{k="1"} 3\ns{k="2"} 3\ns{k="3"} 3\n')[0] == 204  # all known
        # the same text with an extra label is another series: checked and counted on its own
        st, b, _ = _req(imp + "?extra_label=instance=x", "small", b's{k="1"} 4\n')
        assert st == 429 and "active series" in b["error"], b
        st, b, _ = _req(imp + "?extra_label=instance=" + "y" * 41, None, b's{k="1"} 4\n')
        assert st == 400 and "max_label_value_length" in b["error"], b
        # stored with the tenant's label: the tenant sees its three series, the default tenant none
        q = srv.url + "/api/v1/query?" + urllib.parse.urlencode({"query": "s"})
        st, b, _ = _req(q, "small")
        assert st == 200 and sorted(r["metric"]["k"] for r in b["data"]["result"]) == ["1", "2", "3"], b
        assert all(set(r["metric"]) == {"__name__", "k"} for r in b["data"]["result"]), b
        st, b, _ = _req(q)
        assert st == 200 and b["data"]["result"] == [], b
        # a client's own __tenant__ label cannot write into another tenant
        assert _req(imp, "small", b's{k="1",__tenant__="other"} 5\n')[0] == 204
        st, b, _ = _req(srv.url + "/api/v1/query?" + urllib.parse.urlencode({"query": 's{k="1"}'}), "other")
        assert st == 200 and b["data"]["result"] == [], b
        # two senders of the same text (extra labels set apart), twice each: every sample on its own series
        for rnd in range(2):
            for inst, v in (("a", 7), ("b", 8)):
                assert _req(imp + f"?extra_label=instance={inst}", None, f'u{{k="1"}} {v + rnd}\n'.encode())[0] == 204
        st, b, _ = _req(srv.url + "/api/v1/query?" + urllib.parse.urlencode({"query": "u"}))
        assert st == 200 and sorted((r["metric"]["instance"], r["value"][1]) for r in b["data"]["result"]) == \
            [("a", "8"), ("b", "9")], b
        # metadata: a repeated comment block is recorded once, a changed one again
        for help_text in ("first", "first", "second"):
            body = f"# HELP s {help_text}\n# TYPE s gauge\ns{{k=\"1\"}} 6\n".encode()
            assert _req(imp, "small", body)[0] == 204
        st, b, _ = _req(srv.url + "/api/v1/metadata?metric=s", "small")
        assert st == 200 and sorted(m["help"] for m in b["data"]["s"]) == ["first", "second"], b
