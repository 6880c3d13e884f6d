"""The cluster simulator's invariants and cost model: every request served once, FIFO prefill that
never idles while a ready job waits, TTFT never below the zero-queue floor, same seed -> same result,
the H20/Qwen2.5-7B constants in their units, link timelines, Vesta's fetch-or-recompute choice, the
agent trace's statistics, and docs/scheduling.md's quick-reproduction table reproduced by the CLI."""
from __future__ import annotations

import re
import subprocess
import sys
from collections import defaultdict

import numpy as np
import pytest

from scheduler_metrics.schedulers.vesta import VestaScheduler
from scheduler_metrics.sim.agent_trace import AgentTraceParams, generate, parse_spec
from scheduler_metrics.sim.cluster import ClusterSim
from scheduler_metrics.sim.constants import DEFAULT
from scheduler_metrics.sim.links import LinkTimeline, reserve
from scheduler_metrics.sim.replay import ReplaySpec, run_one, time_scale_for
from scheduler_metrics.sim.signals import OracleSignals
from tests.helpers import REPO

SMALL = AgentTraceParams(sessions=25, seed=5)


@pytest.fixture(scope="module")
def agent_runs():
    t = generate(SMALL)
    spec = ReplaySpec(t, instances=8, signals="oracle")
    return t, {s: run_one(spec, s, 2.0) for s in ("vesta", "smetric:0.5", "llm-d")}


def test_every_request_is_served_exactly_once(agent_runs) -> None:
    t, runs = agent_runs
    for r in runs.values():
        idx = sorted(d.idx for d in r.details)
        assert idx == list(range(len(t)))
        assert r.requests == len(t) and r.output_tokens == int(t.output_tokens.sum())


def test_ttft_never_below_the_zero_queue_floor(agent_runs) -> None:
    _, runs = agent_runs
    for name, r in runs.items():
        assert (r.ttft_s >= r.floor_s - 1e-9).all(), name
        assert r.mean_ttft_ms >= r.floor_ms and 0 <= r.queue_share < 1


def test_prefill_is_fifo_and_work_conserving(agent_runs) -> None:
    t, runs = agent_runs
    for name, r in runs.items():
        by_inst = defaultdict(list)
        for d in r.details:
            # every prompt token is either reused or computed (at least one token is computed)
            assert d.cached_tokens + d.computed_tokens == t.input_tokens[d.idx]
            assert d.computed_tokens >= 1 and d.cached_tokens <= t.reuse_tokens[d.idx]
            assert d.prefill_end_s > d.prefill_start_s >= d.ready_s >= d.issued_s
            by_inst[d.executor].append(d)
        for jobs in by_inst.values():
            jobs.sort(key=lambda d: d.prefill_start_s)
            for a, b in zip(jobs, jobs[1:]):
                assert b.prefill_start_s >= a.prefill_end_s - 1e-9  # one prefill at a time
            # the server starts a job as soon as it is free and the job's KV inputs are there:
            # it idles only while the job at the head of its queue waits for its data
            free = 0.0
            for d in jobs:
                assert d.prefill_start_s == pytest.approx(max(free, d.ready_s, d.issued_s), abs=1e-9), name
                free = d.prefill_end_s


def test_turns_wait_for_the_previous_turn_and_its_tool_time(agent_runs) -> None:
    t, runs = agent_runs
    for r in runs.values():
        done = {d.idx: d.done_s for d in r.details}
        issued = {d.idx: d.issued_s for d in r.details}
        for i in np.flatnonzero(t.parent >= 0):
            assert issued[i] >= done[int(t.parent[i])] + t.gap_s[i] - 1e-9


def test_colocated_decodes_are_slowed_by_co_running_prefill(agent_runs) -> None:
    t, runs = agent_runs
    r = runs["vesta"]
    undisturbed = np.array([DEFAULT.decode_time(int(t.output_tokens[d.idx]), 1) for d in r.details])
    actual = np.array([d.done_s - d.decode_start_s for d in r.details])
    stretched = actual > undisturbed * 1.5
    assert stretched.mean() > 0.05  # prefills landing on a GPU stall the decodes running there
    assert np.isfinite(r.decode_tps) and r.decode_tps > 0


def test_same_seed_same_result() -> None:
    a, b = generate(SMALL), generate(SMALL)
    for f in ("arrival_s", "input_tokens", "output_tokens", "session", "reuse_tokens", "parent", "gap_s"):
        assert np.array_equal(getattr(a, f), getattr(b, f))
    assert not np.array_equal(generate(AgentTraceParams(sessions=25, seed=6)).input_tokens[:50], a.input_tokens[:50])
    # through TurboProm's congestion tracker (its clock is the simulated one)
    small = AgentTraceParams(sessions=10, seed=5)
    r1 = run_one(ReplaySpec(generate(small), instances=8), "vesta", 2.0)
    r2 = run_one(ReplaySpec(generate(small), instances=8), "vesta", 2.0)
    assert np.array_equal(r1.ttft_s, r2.ttft_s) and r1.kv_transfer_bytes == r2.kv_transfer_bytes


def test_agent_trace_shape_and_spec() -> None:
    t = generate(AgentTraceParams(sessions=300, seed=1))
    s = t.stats()
    assert 9 <= s["turns_per_session_mean"] <= 15 and s["turns_per_session_p99"] > 3 * s["turns_per_session_p50"]  # skewed
    assert s["reuse_share_continuations"] > 0.9
    cont = np.flatnonzero(t.parent >= 0)
    p = t.parent[cont]
    # a continuation re-sends the previous prompt and its output, then appends the tool output
    assert np.array_equal(t.reuse_tokens[cont], t.input_tokens[p] + t.output_tokens[p])
    assert (t.input_tokens[cont] > t.reuse_tokens[cont]).all() and (t.session[cont] == t.session[p]).all()
    assert (t.input_tokens <= 131_072).all() and (t.gap_s[cont] > 0).all()
    assert parse_spec("agent:sessions=7,seed=3,think_median_s=0.5") == AgentTraceParams(sessions=7, seed=3, think_median_s=0.5)
    with pytest.raises(ValueError, match="unknown parameter 'bogus'"):
        parse_spec("agent:bogus=1")


def test_cost_model_units() -> None:
    m, hw = DEFAULT.model, DEFAULT.hw
    assert m.kv_bytes_per_token == 28 * 2 * 4 * 128 * 2
    # H20: 148 TFLOPS bf16 x 55% over 2 x 7.61e9 FLOP/token
    assert m.prefill_tokens_per_s == pytest.approx(5348, rel=1e-3)
    # a 10k-token prefill on an idle H20 ~ 2.1 s; the quadratic term is ~12% of it
    assert DEFAULT.prefill_time(10_000) == pytest.approx(0.015 + 10_000 / 5348 + 2.467e-9 * 1e8, rel=1e-3)
    # fetching that prefix across nodes: 1 ms + 573 MB / 22.5 GB/s = 26.5 ms; inside a node over NVLink 2.8 ms;
    # loading it from host DRAM over PCIe Gen5 at 32 GB/s: 17.9 ms
    assert DEFAULT.network_time(10_000, same_node=False) == pytest.approx(0.001 + 10_000 * 57_344 / 22.5e9)
    assert DEFAULT.network_time(10_000, same_node=True) == pytest.approx(0.001 + 10_000 * 57_344 / 315e9)
    assert DEFAULT.h2d_time(10_000) == pytest.approx(10_000 * 57_344 / 32e9)
    # decode step: 15.2 GB of weights at 2.8 TB/s + 1 ms; plus the batch's KV read
    assert DEFAULT.decode_step_time(1, 0) == pytest.approx(7.61e9 * 2 / 2.8e12 + 0.001)
    assert DEFAULT.decode_step_time(8, 100_000) > DEFAULT.decode_step_time(8, 0)
    # a 2048-token chunk takes ~0.38 s, so co-running decodes advance only ~2% as fast
    assert 0.95 < DEFAULT.decode_stall_fraction(16, 50_000) < 1.0
    assert DEFAULT.with_hw(gpus_per_nic=1).hw.gpus_per_nic == 1 and hw.gpus_per_nic == 8


def test_link_timeline_takes_the_earliest_common_gap() -> None:
    a, b = LinkTimeline(), LinkTimeline()
    assert reserve([a], 10.0, 2.0) == 10.0  # a write-back reserved in the future...
    assert reserve([a, b], 0.0, 1.0) == 0.0  # ...does not block a fetch issued now
    assert reserve([a, b], 0.5, 1.0) == 1.0  # but a fetch never overlaps another on the same link
    assert reserve([b], 0.0, 9.5) == 2.0
    assert reserve([a, b], 0.0, 0.5) == 12.0  # a: busy 0-2 and 10-12, b: 0-2 and 2-11.5: first common gap
    assert a.free_at(0.2) == 2.0 and a.free_at(5.0) == 5.0
    assert a.reserved_between(0.0, 11.0) == pytest.approx(3.0)


def test_vesta_recomputes_instead_of_fetching_over_a_slow_link() -> None:
    t = generate(SMALL)
    slow = DEFAULT.with_hw(nic_bytes_per_s=2e8, nvlink_bytes_per_s=2e8)
    fast = run_one(ReplaySpec(t, instances=8, signals="oracle"), "vesta", 2.0)
    crawl = run_one(ReplaySpec(t, instances=8, constants=slow, signals="oracle"), "vesta", 2.0)
    # with a usable link Vesta fetches prefixes to borrowed GPUs; over a 200 MB/s link (a 10k-token
    # prefix: 2.9 s to fetch, 2.1 s to recompute) it fetches far less and recomputes instead
    assert fast.remote_fraction > 0.05
    assert crawl.remote_fraction < 0.5 * fast.remote_fraction and crawl.recompute_fraction > 0.0


def test_vesta_reuses_temporary_gpu_copies() -> None:
    t = generate(SMALL)
    sched = VestaScheduler(8)
    sim = ClusterSim(t, sched, OracleSignals(), instances=8, time_scale=time_scale_for(t, 2.0, 8))
    r = sim.run()
    holder_of = sched.holder
    # turns executed away from the holder that reused KV without fetching it: a temporary copy
    # left on that GPU by an earlier turn of the session
    reused = [d for d in r.details if d.executor != holder_of.get(int(t.session[d.idx]), -1)
              and d.cached_tokens > 0 and d.transfer_bytes == 0]
    assert reused


def _doc_table() -> tuple[str, str]:
    text = (REPO / "docs" / "scheduling.md").read_text()
    m = re.search(r"<!-- quick-reproduction -->\s*\n\s*(\S*turboprom replay [^\n]+)\n.*?```\n(.*?)```", text, re.S)
    assert m, "docs/scheduling.md lacks the quick-reproduction block"
    return m.group(1).strip(), m.group(2)


def test_cli_reproduces_the_doc_quick_table() -> None:
    cmd, table = _doc_table()
    args = cmd.split()[2:]  # after ".venv/bin/turboprom replay"
    r = subprocess.run([sys.executable, "-m", "turboprom", "replay", *args], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    want = [line.rstrip() for line in table.strip().splitlines()]
    got = [line.rstrip() for line in r.stdout.strip().splitlines()]
    assert got[-len(want):] == want
