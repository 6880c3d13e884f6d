"""The compiled matrix JSON assembly (turboprom._json_native) against its pure-Python fallback in
turboprom/api_json.py: the same text, byte for byte, on matrices of awkward floats (NaN, infinities,
signed zeros, magnitudes at Go's exponent cutoffs), partial presence, non-ASCII and escaped labels.
The peer tests in tests/test_api_json.py hold both to Prometheus's own bytes."""
from __future__ import annotations

import os

import numpy as np
import pytest

from promql.types import QueryResult
from storage.labels import make_labels
from tests.test_api_json import _awkward_floats
from turboprom import api_json

if api_json._json_native is None:
    if os.environ.get("CI"):
        pytest.fail("turboprom._json_native is not built (make install builds it)", pytrace=False)
    pytest.skip("turboprom._json_native is not built (make native)", allow_module_level=True)

LABELS = [{"__name__": "vllm:num_requests_waiting", "instance": "10.0.0.1:8000", "model_name": "meta-llama/Llama-3.1-8B"},
          {"job": "a\"b\\c", "x": "<&>"}, {"name": "ünïcødé ✓", "le": "+Inf"}, {}]


def _matrix(rng: np.random.Generator, S: int, T: int, density: float) -> QueryResult:
    pool = np.array(_awkward_floats(400, seed=int(rng.integers(1 << 30))))
    vals = rng.choice(pool, size=(S, T))
    pres = rng.random((S, T)) < density
    labels = [make_labels({**LABELS[i % len(LABELS)], "i": str(i)}) for i in range(S)]
    ts = np.unique(rng.integers(-5_000, 2_000_000_000_000, size=T))  # ms: negative, whole seconds or not
    ts[: T // 3] = ts[: T // 3] // 1000 * 1000
    ts = np.unique(ts)
    vals, pres = vals[:, : len(ts)], pres[:, : len(ts)]
    return QueryResult("matrix", labels=labels, values=vals, present=pres, timestamps=ts)


def _both(res: QueryResult) -> tuple[str, str]:
    values = np.asarray(res.values, dtype=np.float64)
    present = np.asarray(res.present, dtype=bool)
    counts = present.sum(axis=1)
    keep = np.flatnonzero(counts)
    sub = present[keep]
    tstr = api_json.format_timestamps(np.asarray(res.timestamps))
    labels = [res.labels[i] for i in keep.tolist()]
    cols = np.nonzero(sub)[1]
    vals = values[keep][sub]
    return (api_json.matrix_points_json(labels, counts[keep], tstr, cols, vals, native=True),
            api_json.matrix_points_json(labels, counts[keep], tstr, cols, vals, native=False))


@pytest.mark.parametrize("density", [1.0, 0.7, 0.05])
def test_native_matrix_text_equals_the_python_assembly(density: float) -> None:
    rng = np.random.default_rng(int(density * 100))
    for _ in range(40):
        res = _matrix(rng, int(rng.integers(1, 30)), int(rng.integers(1, 60)), density)
        if not np.asarray(res.present).any():
            continue
        native, python = _both(res)
        assert native == python


def test_full_rows_take_the_timestamp_of_their_position() -> None:
    rng = np.random.default_rng(3)
    res = _matrix(rng, 7, 241, 1.0)
    tstr = api_json.format_timestamps(np.asarray(res.timestamps))
    counts = np.full(7, 241)
    vals = np.asarray(res.values).ravel()
    assert (api_json.matrix_points_json(res.labels, counts, tstr, None, vals, native=True)
            == api_json.matrix_points_json(res.labels, counts, tstr, None, vals, native=False))


def test_whole_response_bodies_are_identical_with_and_without_the_extension(monkeypatch) -> None:
    rng = np.random.default_rng(9)
    res = _matrix(rng, 40, 300, 0.8)
    native = b"".join(api_json.encode_query_result_parts(res, stats="1"))
    monkeypatch.setattr(api_json, "_json_native", None)
    assert native == b"".join(api_json.encode_query_result_parts(res, stats="1"))


def test_inconsistent_arguments_are_refused_not_read_past() -> None:
    m = api_json._json_native
    with pytest.raises(ValueError):  # more points announced than values given
        m.matrix_json(['{}'], np.array([3], np.int64), None, ["1", "2", "3"], b"[1.0,2.0]", np.zeros(0, np.int64), [], True)
    with pytest.raises(ValueError):  # a timestamp index past the timestamps
        m.matrix_json(['{}'], np.array([1], np.int64), np.array([5], np.int64), ["1"], b"[1.0]", np.zeros(0, np.int64), [], True)
    with pytest.raises(ValueError):  # not a JSON array
        m.matrix_json(['{}'], np.array([1], np.int64), None, ["1"], b"1.0", np.zeros(0, np.int64), [], True)


def test_timestamp_text_equals_the_fallback() -> None:
    """``format_timestamps`` (compiled) against ``_format_timestamps_py``: negative times, millis with
    leading zeros, whole seconds, the int64 extremes."""
    rng = np.random.default_rng(11)
    edge = np.array([0, 1, -1, 5, -5, 999, -999, 1000, -1000, 1001, -1001, 1010, 100_000, 1796651340000, 1796651340007,
                     np.iinfo(np.int64).max, np.iinfo(np.int64).min, np.iinfo(np.int64).min + 1], np.int64)
    for ts in (edge, rng.integers(-2**62, 2**62, 5000), rng.integers(-10**6, 10**6, 5000),
               rng.integers(0, 2 * 10**9, 5000) * 1000, np.zeros(0, np.int64)):
        assert api_json.format_timestamps(ts) == api_json._format_timestamps_py(np.ascontiguousarray(ts, np.int64))
    assert api_json.format_timestamps(edge[:12]) == ["0", "0.001", "-0.001", "0.005", "-0.005", "0.999", "-0.999", "1",
                                                     "-1", "1.001", "-1.001", "1.010"]
