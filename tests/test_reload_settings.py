"""Reload of `limits:` and of the planner settings read at each use, through a real server and
`POST /-/reload`: the new values apply at once; planner settings that shape built structures are
logged as needing a restart; a limit's running counts carry over."""
from __future__ import annotations

import urllib.parse
from pathlib import Path

from tests.helpers import ServerProcess, http_json
from tests.test_config_strict import _post, _wait

LONG_QUERY = "sum(up) + sum(up) + sum(up) + sum(up) + sum(up) + sum(up) + sum(up)"  # 71 characters


def _query(url: str, q: str) -> tuple[int, dict]:
    code, body, _ = http_json(url + "/api/v1/query?" + urllib.parse.urlencode({"query": q}))
    return code, body


def _budget(url: str) -> int:
    code, body, _ = http_json(url + "/api/v1/planner/plans")
    assert code == 200, body
    return int(body["data"]["budget_bytes"])


def test_reload_applies_limits_and_planner_settings(tmp_path: Path) -> None:
    cfg = tmp_path / "turboprom.yml"
    cfg.write_text("limits:\n  max_query_length: 40\n  max_concurrent_queries: 4\n"
                   "planner:\n  budget: 64MB\n  pane: 1m\n")
    with ServerProcess(tmp_path / "data", ["--config", str(cfg), "--web.enable-lifecycle"]) as srv:
        code, body = _query(srv.url, LONG_QUERY)
        assert code == 400 and "limits.max_query_length" in body["error"], body
        assert _budget(srv.url) == 64 << 20
        cfg.write_text("limits:\n  max_query_length: 1000\n  max_concurrent_queries: 4\n"
                       "planner:\n  budget: 128MB\n  pane: 30s\n")
        assert _post(srv.url + "/-/reload") == (200, "")
        code, body = _query(srv.url, LONG_QUERY)
        assert code == 200, body
        assert _budget(srv.url) == 128 << 20
        _wait(lambda: "planner setting(s) pane changed" in srv.log_path.read_text(), "the restart notice for planner.pane")
        # queries keep passing the concurrency limit after the swap (slots taken and released on shared counts)
        for _ in range(6):
            assert _query(srv.url, "1 + 1")[0] == 200
        # a limit back down applies again
        cfg.write_text("limits:\n  max_query_length: 40\n  max_concurrent_queries: 4\nplanner:\n  budget: 128MB\n  pane: 30s\n")
        assert _post(srv.url + "/-/reload") == (200, "")
        assert _query(srv.url, LONG_QUERY)[0] == 400
