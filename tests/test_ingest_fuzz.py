"""Fuzzing the decoders: random and mutated bodies never crash, never produce a 5xx, never
corrupt earlier data; the column-wise sample decoder agrees with the protobuf runtime."""
from __future__ import annotations

import math
import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ingest.errors import IngestError
from ingest.proto.messages import Sample
from ingest.remote_write import RemoteWriteDecoder
from ingest.sample_columns import decode_samples
from ingest.snappy_block import compress, decompress
from ingest.text_format import parse_series_key, parse_text
from storage.labels import make_labels
from tests.helpers import ServerProcess
from tests.test_ingest_support import name_is, now_ms, post, read_stored, remote_write, v1_payload, v2_payload

FAST = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FAST
@given(st.lists(st.tuples(st.floats(allow_nan=True, allow_infinity=True), st.integers(-2**63, 2**63 - 1)), max_size=50))
def test_sample_columns_match_protobuf(pairs):
    enc = [Sample(value=v, timestamp=t).SerializeToString() for v, t in pairs]
    vals, ts = decode_samples(enc)
    exp_v = np.array([v for v, _ in pairs], np.float64)
    exp_t = np.array([t for _, t in pairs], np.int64)
    assert np.array_equal(vals.view(np.uint64), exp_v.view(np.uint64))
    assert np.array_equal(ts, exp_t)


@FAST
@given(st.lists(st.binary(max_size=24), max_size=20))
def test_sample_columns_random_bytes_agree_or_refuse(blobs):
    try:
        vals, ts = decode_samples(blobs)
    except IngestError:
        return
    for b, v, t in zip(blobs, vals, ts):
        try:
            ref = Sample.FromString(b)
        except Exception:  # noqa: BLE001 - the runtime refuses it while we accepted: must not happen
            pytest.fail(f"accepted bytes protobuf refuses: {b!r}")
        assert struct.pack("<d", ref.value) == struct.pack("<d", v) and ref.timestamp == t, b


_dec = RemoteWriteDecoder(future_tolerance_ms=0)


@FAST
@given(st.binary(max_size=400))
def test_remote_write_decoders_only_raise_ingest_errors(data):
    for fn in (_dec.decode_v1, _dec.decode_v2):
        try:
            out = fn(data)
        except IngestError as e:
            assert e.status == 400 and e.message
            continue
        b = out.batch
        assert len(b.series_index) == len(b.timestamps) == len(b.values)
        assert (b.series_index < max(len(b.series), 1)).all()


_base = v1_payload([({"__name__": "fz", "a": "b"}, [(1000, 1.0), (2000, 2.0)]), ({"__name__": "fz2"}, [(1000, 0.0)])])


@FAST
@given(st.lists(st.tuples(st.integers(0, len(_base) - 1), st.integers(0, 255)), min_size=1, max_size=6),
       st.integers(0, len(_base)))
def test_mutated_protobuf_only_raise_ingest_errors(flips, cut):
    data = bytearray(_base)
    for pos, val in flips:
        data[pos] = val
    try:
        _dec.decode_v1(bytes(data[:cut]))
    except IngestError as e:
        assert e.status == 400


@FAST
@given(st.binary(max_size=200), st.integers(1, 1 << 20))
def test_snappy_random_never_overallocates(data, limit):
    try:
        out = decompress(data, limit)
        assert len(out) <= limit
    except IngestError as e:
        assert e.status in (400, 413)


@FAST
@given(st.text(max_size=300))
def test_text_parser_only_raises_ingest_errors(text):
    try:
        p = parse_text(text)
        for k in p.keys:
            parse_series_key(k)
    except IngestError as e:
        assert e.status == 400 and e.message


@st.composite
def text_bodies(draw):
    lines = []
    for _ in range(draw(st.integers(0, 8))):
        name = draw(st.sampled_from(["a", "b_total", "ns:rule:rate5m", "_x9", "Z"]))
        labels = draw(st.dictionaries(st.sampled_from(["l", "job", "le", "_k", "x9"]),
                                      st.text(st.characters(blacklist_categories=("Cs",)), max_size=6), max_size=3))
        value = draw(st.floats(allow_nan=False, allow_infinity=True, width=64))
        esc = ",".join(f'{k}="' + v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"') + '"' for k, v in labels.items())
        lines.append((name, labels, value, f"{name}{{{esc}}} " + repr(value).replace("inf", "Inf")))  # Go spelling, value only
    return lines


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text_bodies())
def test_text_parser_roundtrip(lines):
    body = "\n".join(l[3] for l in lines) + "\n"
    p = parse_text(body)
    assert len(p) == len(lines)
    for i, (name, labels, value, _) in enumerate(lines):
        pairs = dict(parse_series_key(p.keys[p.series_index[i]]))
        assert pairs == {"__name__": name, **labels}
        assert p.values[i] == value


@pytest.fixture(scope="module")
def fuzz_server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fuzz")
    s = ServerProcess(tmp / "data").start()
    t = now_ms() - 60_000
    s.baseline_t = t
    assert remote_write(s.url, v1_payload([({"__name__": "keep_me", "i": str(i)}, [(t, float(i)), (t + 1000, i + 0.5)])
                                           for i in range(20)]))[0] == 204
    yield s
    s.stop()


_valid = v1_payload([({"__name__": "fz_live", "x": "1"}, [(now_ms() - 5000, 1.0)])])
_valid_v2 = v2_payload([({"__name__": "fz_live2", "x": "1"}, [(now_ms() - 5000, 1.0)])])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(st.sampled_from(["v1", "v2", "raw", "text"]),
       st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=5), st.integers(0, 10_000), st.binary(max_size=64))
def test_server_never_5xx_on_mutated_bodies(fuzz_server, kind, flips, cut, junk):
    base = {"v1": _valid, "v2": _valid_v2, "raw": compress(_valid), "text": b'fz_text{a="b"} 1\n'}[kind]
    data = bytearray(base)
    for pos, val in flips:
        if data:
            data[pos % len(data)] = val
    data = bytes(data[: cut % (len(data) + 1)]) + junk
    if kind == "text":
        code, _, body = post(fuzz_server.url, "/api/v1/import/prometheus", data)
    elif kind == "raw":
        code, _, body = post(fuzz_server.url, "/api/v1/write", data, {"Content-Type": "application/x-protobuf"})
    else:
        code, _, body = remote_write(fuzz_server.url, data, v2=(kind == "v2"))
    assert code < 500, body


def test_fuzzed_server_kept_earlier_data(fuzz_server):
    fuzz_server.stop()
    got = read_stored(fuzz_server.data_dir, name_is("keep_me"))
    t = fuzz_server.baseline_t
    assert len(got) == 20
    for i in range(20):
        ts, vs = got[make_labels({"__name__": "keep_me", "i": str(i)})]
        assert ts.tolist() == [t, t + 1000] and vs.tolist() == [float(i), i + 0.5]


@FAST
@given(st.lists(st.tuples(st.dictionaries(st.sampled_from(["a", "b", "job", "__name__"]), st.sampled_from(["", "x", "y", "1"]), min_size=1),
                          st.lists(st.tuples(st.integers(-2**40, 2**40), st.floats(allow_nan=False)), max_size=4)), max_size=6),
       st.lists(st.tuples(st.integers(0, 500), st.integers(0, 255)), max_size=3))
def test_fast_walk_agrees_with_protobuf_runtime(series, flips):
    data = bytearray(v1_payload(series))
    for pos, val in flips:
        if data:
            data[pos % len(data)] = val
    data = bytes(data)
    dec = RemoteWriteDecoder(future_tolerance_ms=0)
    ref = RemoteWriteDecoder(future_tolerance_ms=0)
    try:
        a = dec.decode_v1(data).batch
    except IngestError:
        a = None
    try:
        b = ref.decode_v1_runtime(data).batch
    except IngestError:
        b = None
    assert (a is None) == (b is None)
    if a is not None:
        rows_a = sorted((a.series[i], t, v) for i, t, v in zip(a.series_index.tolist(), a.timestamps.tolist(), a.values.view(np.uint64).tolist()))
        rows_b = sorted((b.series[i], t, v) for i, t, v in zip(b.series_index.tolist(), b.timestamps.tolist(), b.values.view(np.uint64).tolist()))
        assert rows_a == rows_b


@pytest.mark.slow
@settings(max_examples=5000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=2000), st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=8))
def test_deep_decoder_fuzz(data, flips):
    """Long run (-m slow): random bodies and mutations of valid ones through every decoder."""
    valid = bytearray(_valid + _base)
    for pos, val in flips:
        valid[pos % len(valid)] = val
    for body in (data, bytes(valid)):
        for fn in (_dec.decode_v1, _dec.decode_v1_runtime, _dec.decode_v2):
            try:
                fn(body)
            except IngestError as e:
                assert e.status == 400
        try:
            decompress(body, 1 << 20)
        except IngestError as e:
            assert e.status in (400, 413)
        try:
            parse_text(body)
        except IngestError as e:
            assert e.status == 400
