"""The compiled remote-write walk (ingest._rw_native) against its pure-Python fallback: on the fuzz
corpus (valid payloads, their mutations, random bytes, exemplars, metadata, histograms, repeated
and non-canonical series) both give identical results, byte for byte, or the same refusal; and
storage finds series by their ingest references exactly as by their labels."""
from __future__ import annotations

import os
import threading

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ingest.errors import IngestError
from ingest.proto.messages import WriteRequest
from ingest.remote_write import RemoteWriteDecoder
from ingest.series_refs import native_available
from storage.batch import SampleBatch
from storage.tsdb import TSDB
from tests.test_ingest_support import v1_payload, v2_payload
from turboprom.limits import Limits, LimitValues, SeriesAdmission

if not native_available():
    if os.environ.get("CI") == "true":
        pytest.fail("ingest._rw_native is not built (make install builds it)", pytrace=False)
    pytest.skip("ingest._rw_native is not built (make native)", allow_module_level=True)

FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def outcome(dec: RemoteWriteDecoder, data: bytes, tenant: str = "default", admission=None, version: int = 1):
    """Everything a decode gives, as comparable bytes and values (or the refusal)."""
    try:
        d = (dec.decode_v1 if version == 1 else dec.decode_v2)(data, tenant, admission)
    except IngestError as e:
        return ("refused", e.reason, e.message, e.status, e.samples)
    b = d.batch
    refs = None if b.series_refs is None or version == 2 else b.series_refs.refs.tobytes()
    return (b.series, b.series_index.tobytes(), b.timestamps.tobytes(), b.values.tobytes(), b.tenant, refs,
            [(m.metric_family, m.type, m.help, m.unit) for m in b.metadata], d.histograms, d.exemplars,
            [(e.series, e.labels, struct_bits(e.value), e.ts) for e in d.exemplar_list])


def struct_bits(v: float) -> bytes:
    return np.float64(v).tobytes()


def rich_payload(series, exemplar_at: int | None = None, metadata: bool = False) -> bytes:
    """Series with samples; an exemplar and a native histogram field on series ``exemplar_at``; metadata."""
    w = WriteRequest()
    for i, (labels, samples) in enumerate(series):
        ts = w.timeseries.add()
        for n, v in sorted(labels.items()):
            ts.labels.add(name=n, value=v)
        for t, v in samples:
            ts.samples.add(value=v, timestamp=t)
        if exemplar_at == i:
            ex = ts.exemplars.add(value=0.5, timestamp=samples[0][0] if samples else 1)
            ex.labels.add(name="trace_id", value=f"t{i}")
            ts.histograms.append(b"\x08\x01")  # refused and counted, not decoded
    if metadata:
        w.metadata.add(metric_family_name="fz", type=1, help="a counter", unit="seconds")
    return w.SerializeToString()


labelsets = st.dictionaries(st.sampled_from(["a", "b", "job", "__name__", "le", "__tenant__"]),
                            st.sampled_from(["", "x", "y", "1", "é", "a" * 130]), min_size=0, max_size=4)
samples = st.lists(st.tuples(st.integers(-2**63, 2**63 - 1), st.floats(allow_nan=True, allow_infinity=True)), max_size=4)
corpus = st.tuples(st.lists(st.tuples(labelsets, samples), max_size=8),
                   st.lists(st.tuples(st.integers(0, 2000), st.integers(0, 255)), max_size=3),
                   st.one_of(st.none(), st.integers(0, 7)), st.booleans(), st.integers(0, 2000))


def _pair() -> tuple[RemoteWriteDecoder, RemoteWriteDecoder]:
    return RemoteWriteDecoder(future_tolerance_ms=0, native=True), RemoteWriteDecoder(future_tolerance_ms=0, native=False)


@FAST
@given(corpus)
def test_native_and_python_walks_agree_byte_for_byte(case):
    series, flips, exemplar_at, metadata, cut = case
    data = bytearray(rich_payload(series, exemplar_at, metadata))
    for pos, val in flips:
        if data:
            data[pos % len(data)] = val
    if flips:
        data = data[:max(cut, len(data) // 2)]
    data = bytes(data)
    native, python = _pair()
    for _ in range(2):  # cold (every series new), then warm (known series by reference)
        assert outcome(native, data) == outcome(python, data)
    adm = SeriesAdmission("team-a", Limits(LimitValues(max_label_value_length=100)))
    for _ in range(2):  # tenant label and input limits applied once per new series, in both
        assert outcome(native, data, "team-a", adm) == outcome(python, data, "team-a", adm)


@FAST
@given(st.binary(max_size=300))
def test_random_bytes_same_refusal_or_result(data):
    native, python = _pair()
    assert outcome(native, data) == outcome(python, data)


v2_meta = st.dictionaries(st.sampled_from(["x", "y", "1", ""]), st.tuples(st.integers(0, 9), st.sampled_from(["", "h", "é"]),
                                                                            st.sampled_from(["", "s"])), max_size=3)


@FAST
@given(st.lists(st.tuples(labelsets, samples), max_size=8), v2_meta,
       st.lists(st.tuples(st.integers(0, 2000), st.integers(0, 255)), max_size=3))
def test_v2_compiled_walk_agrees_with_protobuf_runtime(series, meta, flips):
    """Remote write 2.0: the compiled walk (native=True) against the protobuf runtime path (the
    decoder without the extension), cold and warm, with metadata, mutations and admission."""
    series = [({**lab, "__name__": lab.get("__name__") or "x"} if i % 2 else lab, smp) for i, (lab, smp) in enumerate(series)]
    data = bytearray(v2_payload(series, meta))
    for pos, val in flips:
        if data:
            data[pos % len(data)] = val
    data = bytes(data)
    native, python = _pair()
    for _ in range(2):
        assert outcome(native, data, version=2) == outcome(python, data, version=2)
    adm = SeriesAdmission("team-a", Limits(LimitValues(max_label_value_length=100)))
    for _ in range(2):
        assert outcome(native, data, "team-a", adm, 2) == outcome(python, data, "team-a", adm, 2)


def test_v2_known_series_by_reference_whatever_the_symbol_numbering():
    """The same series under different symbol tables is one reference; metadata per family from the
    first series that carries it; requests the runtime must word (bad references) fall back."""
    native, python = _pair()
    a = v2_payload([({"__name__": "m", "a": "1"}, [(1000, 1.0)]), ({"__name__": "n"}, [(1000, 2.0)])],
                   {"m": (1, "help m", "s"), "n": (2, "help n", "")})
    b = v2_payload([({"__name__": "n"}, [(2000, 2.0)]), ({"__name__": "m", "a": "1"}, [(2000, 1.0)])])
    da, db = native.decode_v2(a).batch, native.decode_v2(b).batch
    assert da.series_refs is not None and db.series_refs is not None
    assert dict(zip(da.series, da.series_refs.refs.tolist())) == dict(zip(db.series, db.series_refs.refs.tolist()))
    assert [(m.metric_family, m.type, m.help, m.unit) for m in da.metadata] == [("m", "counter", "help m", "s"), ("n", "gauge", "help n", "")]
    bad_refs = bytes([0x22, 0x00, 0x2A, 0x04, 0x0A, 0x02, 0x01, 0x05])  # labels_refs 1, 5 with one symbol
    bad_first = bytes([0x22, 0x01, ord("x")])  # symbols must start with ""
    bad_utf8 = bytes([0x22, 0x00, 0x22, 0x02, 0xC3, 0x28])
    for data in (bad_refs, bad_first, bad_utf8, a + b, b"", a[:-1]):
        assert outcome(native, data, version=2) == outcome(python, data, version=2), data


def test_unusual_encodings_fall_back_identically():
    base = v1_payload([({"__name__": "m", "a": "1"}, [(1000, 1.0)]), ({"__name__": "m", "a": "2"}, [(1000, 2.0)])])
    ts = v1_payload([({"__name__": "m", "a": "3"}, [(1000, 3.0)])])
    label = bytes([0x0A, 0x05, 0x0A, 0x01, ord("z"), 0x12, 0x00])  # Label{name: "z", value: ""}
    sample_first = bytes([0x12, 0x00]) + label  # a sample before a label
    cases = [
        base + bytes([0x10, 0x01]),  # unknown top-level varint field
        base + bytes([0x0A, len(sample_first)]) + sample_first,  # labels after samples
        ts[:-1],  # truncated
        base + ts,  # concatenated messages (protobuf merges repeated fields)
        base + base,  # repeated series in one request
        bytes([0x0A, 0x00]),  # an empty TimeSeries: empty label set
        bytes([0x0A, 0x04, 0x12, 0x02, 0x10, 0x05]),  # a sample of no series labels
        b"",
    ]
    for data in cases:
        native, python = _pair()
        for _ in range(2):
            assert outcome(native, data) == outcome(python, data), data


def test_known_series_carry_references_storage_resolves(tmp_path):
    """The references a decoder hands storage give the ids the labels give, across decoders,
    repeats within a request and a decoder's cache being started afresh."""
    db = TSDB(str(tmp_path / "db"), background=False)
    try:
        dec = RemoteWriteDecoder(future_tolerance_ms=0, native=True)
        series = [({"__name__": "m", "i": str(i)}, [(1000, float(i))]) for i in range(50)]
        first = dec.decode_v1(v1_payload(series)).batch
        db.append(first)
        by_labels = {lbl: db.index.get(lbl) for lbl in first.series}
        for t in (2000, 3000):
            again = dec.decode_v1(v1_payload([(lab, [(t, 1.0)]) for lab, _ in series[::-1]] + [(series[0][0], [(t + 1, 2.0)])])).batch
            assert again.series_refs is not None
            ids, created = db.index.ids_for(again.series, again.series_refs)
            assert not created
            assert ids.tolist() == [by_labels[lbl] for lbl in again.series]
            res = db.append(again)
            assert res.accepted == 51 and not res.rejected
        other = RemoteWriteDecoder(future_tolerance_ms=0, native=False)  # another reference space
        b = other.decode_v1(v1_payload(series[:5] + [({"__name__": "m", "i": "new"}, [(1000, 0.0)])])).batch
        ids, created = db.index.ids_for(b.series, b.series_refs)
        assert ids[:5].tolist() == [by_labels[lbl] for lbl in b.series[:5]] and created == [5]
        # a refs column of the wrong length is ignored (labels decide)
        plain = SampleBatch(first.series[:3], np.arange(3), np.full(3, 9000), np.zeros(3))
        assert db.index.ids_for(plain.series, None)[0].tolist() == [by_labels[lbl] for lbl in first.series[:3]]
    finally:
        db.close()


def test_refused_requests_do_not_make_series_known():
    """A request refused by admission (series limit) leaves its new series unknown, so a later
    request with them is counted against the limit again."""
    lim = Limits(LimitValues(), {"t": LimitValues(max_active_series=3)})
    adm = SeriesAdmission("t", lim)
    for native in (True, False):
        dec = RemoteWriteDecoder(future_tolerance_ms=0, native=native)
        four = v1_payload([({"__name__": "m", "i": str(i)}, [(1000, 1.0)]) for i in range(4)])
        with pytest.raises(IngestError) as e:
            dec.decode_v1(four, "t", adm)
        assert e.value.reason == "series_limit" and e.value.status == 429
        with pytest.raises(IngestError):
            dec.decode_v1(four, "t", adm)
        lim = Limits(LimitValues(), {"t": LimitValues(max_active_series=3)})
        adm = SeriesAdmission("t", lim)


def test_concurrent_decoders_share_one_table():
    """Four threads decoding overlapping requests at once (the walk runs without the GIL) agree
    with a single-threaded decode: every series one reference, labels matching it."""
    dec = RemoteWriteDecoder(future_tolerance_ms=0, native=True)
    bodies = [v1_payload([({"__name__": "m", "i": str((k * 37 + j) % 300)}, [(1000 + k, float(j))]) for j in range(200)])
              for k in range(40)]
    results: list = []
    errors: list = []

    def run(part):
        try:
            for b in part:
                results.append(dec.decode_v1(b).batch)
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=run, args=(bodies[i::4],)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    state = dec._tenants["default"].refs
    ref_of: dict = {}
    for b in results:
        for lbl, r in zip(b.series, b.series_refs.refs.tolist()):
            assert state.labels[r] == lbl
            assert ref_of.setdefault(lbl, r) == r
    assert len(state) == len(ref_of) == 300


def test_new_series_share_their_label_pairs(monkeypatch):
    """Series first seen in different requests (compiled and Python walks, 1.0 and 2.0) hold the
    same (name, value) tuple for the pairs they have in common; past the table's cap it starts over
    and the labels stay equal."""
    import storage.labels as L

    for native in (True, False):
        dec = RemoteWriteDecoder(future_tolerance_ms=0, native=native)
        a = dec.decode_v1(v1_payload([({"__name__": "m", "cluster": "c1", "i": "1"}, [(1000, 1.0)])])).batch.series[0]
        b = dec.decode_v2(v2_payload([({"__name__": "m", "cluster": "c1", "i": "2"}, [(1000, 1.0)])])).batch.series[0]
        assert a == (("__name__", "m"), ("cluster", "c1"), ("i", "1")) and b[2] == ("i", "2")
        assert a[0] is b[0] and a[1] is b[1] and a[2] is not b[2]
    monkeypatch.setattr(L, "MAX_INTERNED_PAIRS", 2)
    dec = RemoteWriteDecoder(future_tolerance_ms=0, native=False)
    got = [dec.decode_v1(v1_payload([({"__name__": "m", "cluster": "c1", "i": str(k)}, [(1000, 1.0)])])).batch.series[0]
           for k in range(5)]
    assert got == [(("__name__", "m"), ("cluster", "c1"), ("i", str(k))) for k in range(5)]
    assert len(L._PAIRS) <= 2 + 3
