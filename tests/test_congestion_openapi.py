"""docs/openapi.yaml checked by schemathesis against the real server (with a small pushed fleet)."""
from __future__ import annotations

import urllib.request
from pathlib import Path
from typing import Iterator

import pytest
import schemathesis
from hypothesis import HealthCheck, settings

from scheduler_metrics.instrumentation import WorkerMetrics
from tests.helpers import REPO, ServerProcess

schema = schemathesis.openapi.from_path(REPO / "docs" / "openapi.yaml")


@pytest.fixture(scope="module")
def base_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp: Path = tmp_path_factory.mktemp("openapi")
    cfg = tmp / "turboprom.yml"
    cfg.write_text("congestion:\n  stale_after: 1s\n  drop_after: 600s\n")
    with ServerProcess(tmp / "data", ["--config", str(cfg)]) as server:
        for i, cluster in enumerate(["east", "east", "west"]):
            w = WorkerMetrics(model_name="llama", cluster=cluster, instance=f"w{i}")
            w.set_queue(waiting=i, running=2)
            w.set_prefill_capacity(1000)
            w.add_prompt_tokens(1000, cached=100)
            w.push(server.url)
            w.add_prompt_tokens(1000, cached=100)
            w.push(server.url)
        # an SGLang-only instance (many fields null) and a TGI one without a model label
        body = (b'sglang:num_queue_reqs{cluster="west",model_name="qwen",instance="s1"} 3\n'
                b'sglang:token_usage{cluster="west",model_name="qwen",instance="s1"} 0.5\n'
                b'tgi_queue_size{instance="t1"} 1\n')
        req = urllib.request.Request(server.url + "/api/v1/import/prometheus", data=body, method="POST")
        urllib.request.urlopen(req, timeout=10).close()
        yield server.url


@schema.parametrize()
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
def test_openapi_conformance(case: schemathesis.Case, base_url: str) -> None:
    if case.path.endswith("/stream"):
        # an event stream never ends by itself: one event is enough to check status, type and framing
        case.query = {**(case.query or {}), "limit": 1, "interval": 0}
        response = case.call_and_validate(base_url=base_url, timeout=10)
        if response.status_code == 200:
            assert response.text.count("event: congestion") == 1
        return
    case.call_and_validate(base_url=base_url, timeout=10)
