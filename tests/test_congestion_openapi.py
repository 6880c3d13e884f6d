"""docs/openapi.yaml checked by schemathesis against the real server (with a small pushed fleet)."""
from __future__ import annotations

import urllib.request
from pathlib import Path
from typing import Iterator

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.specs.openapi.checks import negative_data_rejection, positive_data_acceptance

from scheduler_metrics.instrumentation import WorkerMetrics
from tests.helpers import REPO, ServerProcess, free_port

schema = schemathesis.openapi.from_path(REPO / "docs" / "openapi.yaml")


@pytest.fixture(scope="module")
def base_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp: Path = tmp_path_factory.mktemp("openapi")
    cfg = tmp / "turboprom.yml"
    # a KV event publisher nobody runs: the prefix view exists and stays empty
    cfg.write_text("congestion:\n  stale_after: 1s\n  drop_after: 600s\n  kv_events:\n"
                   f"    - {{endpoint: 'tcp://127.0.0.1:{free_port()}', instance: w0, cluster: east, model_name: llama}}\n")
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


def _valid_number(v: object, lo: float, hi: float) -> bool:
    try:
        x = float(v)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return False
    return lo <= x <= hi


# Query parameters are strings on the wire: schemathesis's "null inside an array" negative case arrives
# as the literal string "null", a legitimate label value, so that one check cannot apply here. Every
# other check (status codes, content types, response schemas, server errors) runs.
EXCLUDED = [negative_data_rejection]


def _conformance(case: schemathesis.Case, base_url: str) -> None:
    if case.path.endswith("/stream"):
        # An event stream never ends by itself: valid limit/interval values are narrowed to one event
        # right away; invalid ones are left alone (the server must refuse them).
        q = dict(case.query or {})
        if "limit" not in q or _valid_number(q["limit"], 1, 1_000_000):
            q["limit"] = 1
        if "interval" in q and _valid_number(q["interval"], 0, 3600):
            q["interval"] = 0
        case.query = q
        response = case.call_and_validate(base_url=base_url, timeout=10, excluded_checks=EXCLUDED)
        if response.status_code == 200:
            assert response.text.count("event: congestion") == 1
        return
    if case.path.endswith("/push"):
        # The body is a string in the text exposition grammar, which a JSON schema cannot state:
        # most schema-valid strings are not expositions and are refused (400, named); the other checks run.
        case.call_and_validate(base_url=base_url, timeout=10, excluded_checks=EXCLUDED + [positive_data_acceptance])
        return
    case.call_and_validate(base_url=base_url, timeout=10, excluded_checks=EXCLUDED)


# One test function per API operation: ``schema.parametrize()`` over the whole schema names each
# operation's item ``test_x[GET /path]`` but gives them all the node id ``test_x``, and pytest-xdist
# (``make test`` runs two workers) then runs only one of them.
OPERATIONS = {
    "snapshot": ("GET", "/api/v1/congestion"),
    "stream": ("GET", "/api/v1/congestion/stream"),
    "push": ("POST", "/api/v1/congestion/push"),
    "prefix": ("POST", "/api/v1/congestion/prefix"),
    "model_server_metrics": ("GET", "/api/v1/congestion/model_server/{instance}/metrics"),
}


def _operation_test(method: str, path: str):
    def test(case: schemathesis.Case, base_url: str) -> None:
        _conformance(case, base_url)

    return schema.include(method=method, path=path).parametrize()(
        settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))(test))


test_openapi_snapshot = _operation_test(*OPERATIONS["snapshot"])
test_openapi_stream = _operation_test(*OPERATIONS["stream"])
test_openapi_push = _operation_test(*OPERATIONS["push"])
test_openapi_prefix = _operation_test(*OPERATIONS["prefix"])
test_openapi_model_server_metrics = _operation_test(*OPERATIONS["model_server_metrics"])


def test_every_operation_of_the_schema_has_its_test() -> None:
    ops = {(o.ok().method.upper(), o.ok().path) for o in schema.get_all_operations()}
    assert ops == set(OPERATIONS.values()), ops ^ set(OPERATIONS.values())
