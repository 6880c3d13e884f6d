"""The metric schema, its documentation, and the prometheus-client instrumentation built from it."""
from __future__ import annotations

import json
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from scheduler_metrics.instrumentation import FlowMetrics, SchedulerMetrics, WorkerMetrics
from scheduler_metrics.schema import (ALIASES, CONGESTION_FAMILIES, FAMILIES, FAMILY_BY_NAME, SIGNAL_BY_SAMPLE_NAME,
                                      Signal)
from tests.helpers import REPO, free_port, require_binary, wait_http

DOC = (REPO / "docs" / "metrics.md").read_text()


def doc_row(name: str) -> str:
    rows = [line for line in DOC.splitlines() if line.startswith(f"| `{name}` |")]
    assert len(rows) == 1, f"{name} must have exactly one row in docs/metrics.md"
    return rows[0]


@pytest.mark.parametrize("fam", FAMILIES, ids=lambda f: f.name)
def test_every_family_documented_with_type_and_unit(fam) -> None:
    name = fam.name if fam.type == "histogram" else fam.sample_name
    cells = [c.strip() for c in doc_row(name).strip("|").split("|")]
    assert cells[1] == fam.type and cells[3] == fam.unit
    for label in fam.labels:
        assert label in cells[2]
    if fam.signal is not None:
        assert f"`{fam.signal.value}`" in cells[6]


def test_aliases_and_written_back_families_documented() -> None:
    for a in ALIASES:
        assert a.stack in doc_row(a.sample_name)
    for c in CONGESTION_FAMILIES:
        assert c.unit in doc_row(c.name)


def test_vllm_names_and_required_vesta_agentweave_families() -> None:
    for name in ("vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc",
                 "vllm:time_to_first_token_seconds", "vllm:prompt_tokens", "vllm:generation_tokens",
                 "vllm:prefix_cache_hits", "vllm:prefix_cache_queries"):
        assert FAMILY_BY_NAME[name].origin == "vllm"
    assert SIGNAL_BY_SAMPLE_NAME["vllm:prompt_tokens_total"].signal is Signal.PROMPT_TOKENS
    assert SIGNAL_BY_SAMPLE_NAME["sglang:num_queue_reqs"].signal is Signal.QUEUE_LENGTH
    assert SIGNAL_BY_SAMPLE_NAME["vllm_num_requests_waiting"].signal is Signal.QUEUE_LENGTH  # escaped form
    need = ["prefill_backlog", "prefill_throughput", "kv_held", "kv_transfer", "kv_writeback", "assignments",
            "flow_queue_depth", "chunk_size", "partial_progress", "round_overhead"]
    names = " ".join(FAMILY_BY_NAME)
    assert all(n in names for n in need)
    assert set(FAMILY_BY_NAME["turboprom_scheduler_assignments"].labels) >= {"holder", "executor"}


def exported(text: bytes) -> dict[str, tuple[str, list]]:
    return {f.name: (f.type, f.samples) for f in text_string_to_metric_families(text.decode())}


def test_worker_exposition_matches_schema() -> None:
    w = WorkerMetrics(model_name="llama", cluster="east", instance="w1")
    w.set_queue(waiting=3, running=5)
    w.set_kv_usage(0.5)
    w.set_prefill_backlog(4096)
    w.set_prefill_capacity(9000)
    w.set_prefill_throughput(4000)
    w.add_prompt_tokens(1000, cached=250)
    w.add_generation_tokens(10)
    w.request_finished("length", prompt_tokens=1000, ttft_s=0.2, e2e_s=1.0, queue_s=0.1, prefill_s=0.1,
                       inter_token_s=[0.01, 0.02])
    w.set_kv_held("8k-16k", 12000, 3)
    w.add_kv_transfer(1 << 20, "in", "bucket_migration")
    w.add_kv_writeback(1 << 10, "out")
    w.preempted()
    fams = exported(w.exposition())
    for name in WorkerMetrics.FAMILY_NAMES:
        fam = FAMILY_BY_NAME[name]
        typ, samples = fams[name]
        assert typ == fam.type, name
        for s in samples:
            assert s.labels["cluster"] == "east" and s.labels["model_name"] == "llama" and s.labels["instance"] == "w1"
            assert not s.name.endswith("_created")
    values = {(s.name, tuple(sorted(s.labels.items()))): s.value for _, ss in fams.values() for s in ss}
    ident = (("cluster", "east"), ("instance", "w1"), ("model_name", "llama"))
    assert values[("vllm:prompt_tokens_total", ident)] == 1000
    assert values[("vllm:prefix_cache_hits_total", ident)] == 250
    assert values[("turboprom_worker_prefill_computed_tokens_total", ident)] == 750
    assert values[("vllm:request_success_total", tuple(sorted(ident + (("finished_reason", "length"),))))] == 1
    assert values[("vllm:num_requests_waiting", ident)] == 3


def test_scraped_worker_has_no_instance_label_and_validation() -> None:
    w = WorkerMetrics(model_name="llama")
    w.set_queue(1, 1)
    for _, samples in exported(w.exposition()).values():
        for s in samples:
            assert "instance" not in s.labels and s.labels["cluster"] == "default"
    with pytest.raises(ValueError, match="fraction"):
        w.set_kv_usage(1.5)
    with pytest.raises(ValueError, match="cached"):
        w.add_prompt_tokens(10, cached=11)
    with pytest.raises(ValueError, match="direction"):
        w.add_kv_transfer(1, "sideways")


def test_scheduler_and_flow_exposition() -> None:
    s = SchedulerMetrics("vesta", cluster="east")
    s.assigned("w1", "w2", penalty_s=0.004)
    s.assigned("w1", "w1")
    fams = exported(s.exposition())
    (a,) = [x for x in fams["turboprom_scheduler_assignments"][1] if x.labels["executor"] == "w2"]
    assert a.labels["holder"] == "w1" and a.labels["scheduler"] == "vesta" and a.value == 1
    f = FlowMetrics(cluster="east")
    f.set_queue_depth("rag", "rerank", 7)
    f.set_chunk_size("rag", "embed", 32)
    f.set_partial_progress("rag", "embed", 0.25)
    f.chunk_completed("rag", "embed", 2)
    f.round_done("rag", 0.003)
    fams = exported(f.exposition())
    assert fams["turboprom_flow_queue_depth"][1][0].value == 7
    assert fams["turboprom_flow_round_overhead_seconds"][0] == "histogram"
    with pytest.raises(ValueError):
        f.set_partial_progress("rag", "embed", 2.0)


def test_served_metrics_endpoint() -> None:
    w = WorkerMetrics(model_name="llama", cluster="east")
    w.set_queue(4, 1)
    port = w.serve(0)
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            fams = exported(r.read())
        assert fams["vllm:num_requests_waiting"][1][0].value == 4
    finally:
        w.close()


@pytest.mark.peer
def test_push_into_victoria_metrics(tmp_path: Path) -> None:
    """The same push works against a real VictoriaMetrics (its /api/v1/import/prometheus)."""
    vm = require_binary("victoria-metrics")
    port = free_port()
    proc = subprocess.Popen([vm, f"-httpListenAddr=127.0.0.1:{port}", f"-storageDataPath={tmp_path / 'vm'}",
                             "-search.latencyOffset=0s", "-search.disableCache"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_http(url + "/health", timeout=30, proc=proc)
        w = WorkerMetrics(model_name="llama", cluster="east", instance="w9")
        w.set_queue(waiting=6, running=2)
        assert w.push(url) == 204
        q = urllib.parse.urlencode({"query": 'vllm:num_requests_waiting{instance="w9"}'})
        deadline = time.time() + 20
        result: list = []
        while time.time() < deadline and not result:
            urllib.request.urlopen(url + "/internal/force_flush", timeout=5).close()
            with urllib.request.urlopen(f"{url}/api/v1/query?{q}", timeout=5) as r:
                result = json.loads(r.read())["data"]["result"]
            time.sleep(0.3)
        assert result and result[0]["value"][1] == "6"
        assert result[0]["metric"]["cluster"] == "east" and result[0]["metric"]["model_name"] == "llama"
    finally:
        proc.terminate()
        proc.wait(10)
