"""The compiled text walk (ingest/text_native.py) against the column-wise parser
(ingest/text_format.parse_text): whenever the walk gives a result it is the parser's, value bits,
line numbers and metadata included, on real exporter bodies and a fuzz corpus; the scrape path
gives the same batches with either."""
from __future__ import annotations

import os
import subprocess
import urllib.request

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ingest.errors import IngestError
from ingest.scrape.process import SeriesState, process_scrape
from ingest.series_refs import native_available
from ingest.text_format import parse_text
from ingest.text_native import TextRefs
from storage.labels import make_labels
from tests.helpers import free_port, require_binary, wait_http

if not native_available():
    if os.environ.get("CI") == "true":
        pytest.fail("ingest._rw_native is not built (make install builds it)", pytrace=False)
    pytest.skip("ingest._rw_native is not built (make native)", allow_module_level=True)

FAST = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def parsed_view(p) -> tuple:
    """Everything a ParsedText holds, comparable (values by their bits)."""
    ts = np.where(p.has_ts, p.timestamps, 0)
    return (list(p.keys), p.series_index.astype(np.int64).tolist(), p.values.view(np.uint64).tolist(), ts.tolist(),
            p.has_ts.tolist(), np.asarray(p.lines, np.int64).tolist(),
            [(m.metric_family, m.type, m.help, m.unit) for m in p.metadata], p.exemplars)


def outcome(fn, body: bytes):
    try:
        r = fn(body)
    except IngestError as e:
        return ("refused", e.reason, e.message)
    return None if r is None else parsed_view(r)


def vllm_body(engine: int, step: int) -> bytes:
    """A vLLM engine's /metrics: HELP/TYPE, gauges, counters, histograms with le, model_name labels."""
    model = ("meta-llama/Llama-3.1-70B-Instruct", "Qwen/Qwen2.5-32B-Instruct")[engine % 2]
    lab = f'engine="0",model_name="{model}"'
    out = []
    for name, kind, v in (("vllm:num_requests_running", "gauge", step % 7), ("vllm:num_requests_waiting", "gauge", step % 3),
                          ("vllm:kv_cache_usage_perc", "gauge", (step % 100) / 100.0),
                          ("vllm:prompt_tokens_total", "counter", 1000.0 * step + 0.5),
                          ("vllm:generation_tokens_total", "counter", 731.0 * step)):
        out += [f"# HELP {name} {name.split(':')[1]} of the engine.", f"# TYPE {name} {kind}", f"{name}{{{lab}}} {v!r}"]
    for h in ("vllm:time_to_first_token_seconds", "vllm:e2e_request_latency_seconds"):
        out += [f"# HELP {h} Histogram of {h}.", f"# TYPE {h} histogram"]
        for k, le in enumerate(("0.001", "0.005", "0.01", "0.05", "0.1", "0.5", "1.0", "5.0", "+Inf")):
            out.append(f'{h}_bucket{{{lab},le="{le}"}} {float(step * (k + 1))}')
        out += [f"{h}_sum{{{lab}}} {step * 0.37!r}", f"{h}_count{{{lab}}} {float(step * 9)}"]
    return ("\n".join(out) + "\n").encode()


def test_vllm_and_node_exporter_bodies_take_the_compiled_walk_and_agree():
    ne = require_binary("prometheus-node-exporter")
    port = free_port()
    proc = subprocess.Popen([ne, f"--web.listen-address=127.0.0.1:{port}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_http(f"http://127.0.0.1:{port}/metrics", 30, proc)
        node = [urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read() for _ in range(2)]
    finally:
        proc.terminate()
        proc.wait(10)
    for bodies in (node, [vllm_body(3, s) for s in range(3)]):
        refs = TextRefs()
        for body in bodies:  # the second and third with the series already known
            ours = outcome(refs.parse, body)
            assert ours is not None and ours[0] and ours == outcome(parse_text, body)
        assert len(refs) == len(outcome(parse_text, bodies[0])[0])


NAMES = st.sampled_from(["m", "up", "node_cpu_seconds_total", "a:b_c", "_x", "9bad", "bad-name", "vllm:num_requests_running"])
LNAMES = st.sampled_from(["le", "cpu", "mode", "model_name", "a", "__x", "bad-l", "9"])
LVALUES = st.sampled_from(["", "0", "idle", "+Inf", "0.5", 'say "hi"', "back\\slash", "new\nline", "ünï", "a}b", "a#b",
                           "x,y", "{", " "])
VALUES = st.sampled_from(["1", "-0", "0", "1e3", "1E-3", ".5", "1.", "+1", "-2.5e+10", "NaN", "nan", "+Inf", "-Inf", "Inf",
                          "inf", "Infinity", "1_000", "0x10", "abc", "", "1.7976931348623157e308", "4.9e-324", "1e400",
                          "0.1000000000000000055511151231257827", "00012", "1#"])
TSS = st.sampled_from(["", "", "", "1700000000000", "-5", "007", "+5", "1.5", "99999999999999999999", "0", "12a"])
BLANKS = st.sampled_from([" ", "\t", "  ", " \t"])


def _esc(v: str) -> str:
    return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


@st.composite
def sample_line(draw) -> str:
    name = draw(NAMES)
    labels = draw(st.lists(st.tuples(LNAMES, LVALUES), max_size=4))
    raw = draw(st.booleans())  # sometimes values unescaped (invalid or odd on purpose)
    inner = ",".join(f'{n}="{v if raw else _esc(v)}"' for n, v in labels)
    series = name + (("{" + inner + draw(st.sampled_from(["", ","])) + "}") if labels or draw(st.booleans()) else "")
    line = draw(st.sampled_from(["", " ", "\t"])) + series + draw(BLANKS) + draw(VALUES)
    ts = draw(TSS)
    if ts:
        line += draw(BLANKS) + ts
    return line + draw(st.sampled_from(["", "", " ", "\r", " # {a=\"b\"} 1"]))


COMMENTS = st.sampled_from(["# HELP m some help", "# TYPE m counter", "# TYPE up gauge", "# TYPE m bogus", "# HELP m a\\nb",
                            "# just a comment", "  # indented", "# UNIT m seconds", "# EOF", "#", "# TYPE"])


@FAST
@given(st.lists(st.one_of(sample_line(), COMMENTS, st.sampled_from(["", "  "])), max_size=12),
       st.sampled_from(["\n", ""]), st.integers(0, 3))
def test_fuzz_corpus_walk_agrees_with_the_parser(lines, tail, repeat):
    body = ("\n".join(lines) + tail).encode()
    refs = TextRefs()
    for _ in range(1 + repeat):  # known series on later rounds
        ours = outcome(refs.parse, body)
        if ours is not None:
            assert ours == outcome(parse_text, body)


@FAST
@given(st.binary(max_size=200))
def test_random_bytes_never_differ(data):
    ours = outcome(TextRefs().parse, data)
    if ours is not None:
        assert ours == outcome(parse_text, data)


def test_shapes_left_to_the_parser():
    """The walk hands these to parse_text (its messages, its spellings) instead of guessing."""
    for body in (b'm{a="1"} 1 # {t="x"} 1\n', b"m 1\r\n", b'{"m.x"} 1\n', b"m 1_000\n", b"m inf\n", b"m 1\n# EOF\n",
                 b"m 1 1.5\n", b"m\t {a=\"b\"} 1\n", b"\xff 1\n", b"m{a=\"\xc3\xa9\"} 1\x0b\n", b"bad-name 1\n", b"m\n"):
        assert TextRefs().parse(body) is None, body
    assert TextRefs().parse(b'm{a="\xc3\xa9"} 1\n') is not None


def test_scrape_batches_equal_with_and_without_the_walk():
    """process_scrape over a target's scrapes (series appearing and vanishing, relabelled target
    labels, timestamps) gives the same batches, counts and metadata through either parser."""
    target = make_labels({"job": "vllm", "instance": "10.0.0.7:8000"})
    walk, plain = SeriesState(), SeriesState(text=None)
    assert walk.text is not None
    bodies = [vllm_body(1, 5), vllm_body(1, 6), vllm_body(1, 6).replace(b"vllm:num_requests_waiting{", b"gone{"),
              b"# TYPE m gauge\nm 1 1700000000000\nm2{a=\"b\"} 2\n", vllm_body(1, 7)]
    for k, body in enumerate(bodies):
        got = []
        for state in (walk, plain):
            o = process_scrape(body, "text/plain; version=0.0.4", 1_700_000_100_000 + k * 15_000, target, state,
                               honor_labels=False, honor_timestamps=True, mrc=[])
            b = o.batch
            rows = sorted(zip((b.series[i] for i in b.series_index.tolist()), b.timestamps.tolist(),
                              b.values.view(np.uint64).tolist()))
            got.append((rows, o.scraped, o.post_relabel, o.added, [(m.metric_family, m.type, m.help) for m in o.metadata]))
        assert got[0] == got[1] and got[0][1] > 0


def test_scrape_batches_carry_help_type_when_the_block_changes():
    """A target's HELP/TYPE block goes into the batch (and so the metadata store) on the first scrape,
    when it changes, and at least every METADATA_REFRESH_MS; repeats in between carry none, while the
    scrape outcome always has it."""
    from ingest.scrape.process import METADATA_REFRESH_MS

    target = make_labels({"job": "vllm", "instance": "10.0.0.7:8000"})
    state = SeriesState()
    t0 = 1_700_000_100_000

    def scrape(body: bytes, ts: int):
        return process_scrape(body, "text/plain; version=0.0.4", ts, target, state, honor_labels=False,
                              honor_timestamps=True, mrc=[])

    first = scrape(vllm_body(1, 5), t0)
    assert first.batch.metadata and first.metadata
    again = scrape(vllm_body(1, 5), t0 + 15_000)
    assert again.batch.metadata == [] and again.metadata == first.metadata
    changed = scrape(vllm_body(1, 5).replace(b"# HELP vllm:num_requests_waiting ", b"# HELP vllm:num_requests_waiting Now "),
                     t0 + 30_000)
    assert changed.batch.metadata and any("Now" in m.help for m in changed.batch.metadata)
    assert scrape(vllm_body(1, 5), t0 + 45_000).batch.metadata  # changed back
    assert scrape(vllm_body(1, 5), t0 + 60_000).batch.metadata == []
    assert scrape(vllm_body(1, 5), t0 + 45_000 + METADATA_REFRESH_MS).batch.metadata
