"""Matcher semantics of the inverted index and of select/series/label APIs, checked with
hypothesis against a brute-force reference (Matcher.matches on every series, "" for a missing label)."""
from __future__ import annotations

import tempfile
import time

import numpy as np
from hypothesis import HealthCheck, given, settings, strategies as st

from storage.batch import SampleBatch
from storage.index import SeriesIndex
from storage.labels import make_labels
from storage.matchers import Matcher
from storage.options import StorageOptions
from storage.tsdb import TSDB

NAMES = ["__name__", "job", "env", "le"]
VALUES = ["a", "b", "ab", "ba", "x1", "", "a.b", "A"]
PATTERNS = ["a", "b", "", ".*", ".+", "a.*", ".*b", "a|b", "(a|)", "x[0-9]", "a\\.b", "(?i)a", "ab|ba", "[ab]+", "b?"]
NOW = int(time.time() * 1000)

label_sets = st.lists(
    st.dictionaries(st.sampled_from(NAMES), st.sampled_from(VALUES), min_size=0, max_size=4).map(make_labels),
    min_size=1, max_size=30, unique=True).filter(lambda ls: all(len(x) > 0 for x in ls))


@st.composite
def matchers(draw):
    name = draw(st.sampled_from(NAMES + ["missing"]))
    op = draw(st.sampled_from(["=", "!=", "=~", "!~"]))
    value = draw(st.sampled_from(PATTERNS if op in ("=~", "!~") else VALUES))
    return Matcher(name, op, value)


def brute(series, ms):
    return sorted(s for s in series if all(m.matches(dict(s).get(m.name, "")) for m in ms))


@settings(max_examples=150, deadline=None)
@given(label_sets, st.lists(matchers(), min_size=1, max_size=3))
def test_index_matches_brute_force(series, ms):
    idx = SeriesIndex()
    for s in series:
        idx.get_or_create(s)
    got = sorted(idx.labels[i] for i in idx.match_ids(ms))
    assert got == brute(series, ms)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(label_sets, st.lists(matchers(), min_size=1, max_size=3), st.lists(matchers(), min_size=1, max_size=2), st.booleans())
def test_tsdb_select_series_labels_match_brute_force(series, ms, ms2, flush):
    with tempfile.TemporaryDirectory() as d:
        with TSDB(d, StorageOptions(), background=False) as db:
            t0 = NOW - 3_600_000
            # half the series only have old samples, half only recent ones
            items = [(s, np.array([t0 if i % 2 else NOW - 1000]), np.array([float(i)])) for i, s in enumerate(series)]
            db.append(SampleBatch.from_series(items))
            if flush:
                db.flush_head()
            want = brute(series, ms)
            ss = db.select(ms, 0, NOW)
            assert ss.labels == want
            assert ss.values.tolist() == [float(series.index(s)) for s in want]
            recent = [s for i, s in enumerate(series) if not i % 2]
            assert db.series([ms], NOW - 60_000, NOW) == brute(recent, ms)
            union = sorted(set(brute(recent, ms)) | set(brute(recent, ms2)))
            assert db.series([ms, ms2], NOW - 60_000, NOW) == union
            assert db.label_names(NOW - 60_000, NOW, [ms]) == sorted({n for s in brute(recent, ms) for n, _ in s})
            assert db.label_values("job", 0, NOW, [ms]) == sorted({dict(s)["job"] for s in want if "job" in dict(s)})


eq_matchers = st.lists(st.builds(Matcher, st.sampled_from(NAMES + ["missing"]), st.just("="),
                                 st.sampled_from([v for v in VALUES if v])), min_size=1, max_size=3)


@settings(max_examples=150, deadline=None)
@given(label_sets, eq_matchers, st.integers(0, 30))
def test_equality_matchers_intersect_postings_like_brute_force(series, ms, prefix):
    """Equality-only matcher lists take the postings-intersection path; also over a prefix of ids
    (a reader that saw only the first n series)."""
    idx = SeriesIndex()
    for s in series:
        idx.get_or_create(s)
    ids = idx.match_ids(ms)
    assert ids.dtype == np.int64 and (np.diff(ids) > 0).all()
    assert sorted(idx.labels[i] for i in ids) == brute(series, ms)
    n = min(prefix, len(series))
    assert idx.match_ids(ms, n).tolist() == np.flatnonzero(idx.match_mask(ms, n)).tolist()
