"""Matcher semantics of the inverted index and of select/series/label APIs, checked with
hypothesis against a brute-force reference (Matcher.matches on every series, "" for a missing label);
then the regex matchers themselves (storage/regex.py): Go RE2 syntax and semantics, Go's error texts,
linear time, the GIL released while matching, shortcuts and the bulk kernel equal to RE2."""
from __future__ import annotations

import tempfile
import threading
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from storage.batch import SampleBatch
from storage.index import SeriesIndex
from storage.labels import make_labels
from storage.matchers import Matcher
from storage.options import StorageOptions
from storage.regex import RegexError, compile_regex, expand_template
from storage import regex as rx
from storage.tsdb import TSDB

NAMES = ["__name__", "job", "env", "le"]
VALUES = ["a", "b", "ab", "ba", "x1", "", "a.b", "A"]
PATTERNS = ["a", "b", "", ".*", ".+", "a.*", ".*b", "a|b", "(a|)", "x[0-9]", "a\\.b", "(?i)a", "ab|ba", "[ab]+", "b?",
            "b|(?i)a", "\\pL+", "[[:alpha:]]\\d", "(?P<n>a)b?"]
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


# --- Go RE2 semantics of regex matchers (storage/regex.py) -----------------------------------------

GO_CASES = [  # (pattern, values that match, values that do not), as Go's regexp (RE2) decides
    ("a|(?i)b", ["a", "b", "B"], ["A", "ab"]),
    ("x(?i)y|z", ["xy", "xY", "z", "Z"], ["XY", "Xy"]),  # (?i) lasts to the end of the group, past |
    ("(?i)a(?-i)b", ["ab", "Ab"], ["AB", "aB"]),
    ("((?i)a)b", ["ab", "Ab"], ["aB"]),
    ("\\pL+", ["héllo", "Ωμέγα", "ab"], ["h1", "", "a b"]),
    ("\\p{Greek}+", ["Ωμέγα"], ["abc"]),
    ("[[:alpha:]]+", ["abc", "ABC"], ["é", "a1"]),  # POSIX classes are ASCII
    ("[[:^digit:]]", ["a", "١"], ["1"]),
    ("\\d+", ["123"], ["١٢٣"]),  # \d is ASCII in Go (Python's re: any Unicode digit)
    ("\\w+", ["a_1"], ["é"]),
    ("\\s", [" ", "\t", "\n"], ["\u00a0"]),
    ("(?P<n>a)(?<m>b)", ["ab"], ["a"]),
    ("(?U)a+", ["a", "aaa"], [""]),
    ("\\Qa.b\\E", ["a.b"], ["axb"]),
    ("a.b", ["a\nb", "a.b"], ["ab"]),  # (?s): . matches newline
    ("(?-s)a.b", ["a.b"], ["a\nb"]),
    ("x\\z", ["x"], ["x\n"]),
    ("x$", ["x"], ["x\n"]),  # $ is end of text (Python's $ also matches before a final newline)
    ("b", ["b"], ["ab", "ba", "bb"]),  # fully anchored
    ("a|b|ab", ["a", "b", "ab"], ["ba", ""]),
    ("a||b", ["a", "", "b"], ["ab"]),
    ("a.*", ["a", "abc"], ["ba"]),
    (".*b", ["b", "ab"], ["ba"]),
    (".*b.*", ["b", "abc"], ["ac"]),
    (".+", ["x", "\n"], [""]),
    ("", [""], ["a"]),
]


@pytest.mark.parametrize("pattern,yes,no", GO_CASES)
def test_regex_matchers_follow_go_syntax_and_semantics(pattern, yes, no):
    m = Matcher("l", "=~", pattern)
    nm = Matcher("l", "!~", pattern)
    for v in yes:
        assert m.matches(v) and not nm.matches(v), (pattern, v)
    for v in no:
        assert not m.matches(v) and nm.matches(v), (pattern, v)
    values = yes + no
    assert m.matches_values(values).tolist() == [True] * len(yes) + [False] * len(no)
    assert nm.matches_values(values * 100).tolist() == ([False] * len(yes) + [True] * len(no)) * 100  # bulk kernel


REFUSED = [  # syntax Go's regexp refuses, with Go's message
    ("(a)\\1", "error parsing regexp: invalid escape sequence: `\\1`"),
    ("(?=a)", "error parsing regexp: invalid or unsupported Perl syntax: `(?=`"),
    ("(?!a)", "error parsing regexp: invalid or unsupported Perl syntax: `(?!`"),
    ("(?x)a", "error parsing regexp: invalid or unsupported Perl syntax: `(?x`"),
    ("a\\C", "error parsing regexp: invalid escape sequence: `\\C`"),
    ("a\\Z", "error parsing regexp: invalid escape sequence: `\\Z`"),
    ("(a", "error parsing regexp: missing closing ): `(a`"),
    ("a)", "error parsing regexp: unexpected ): `a)`"),
    ("[a", "error parsing regexp: missing closing ]: `[a`"),
    ("a**", "error parsing regexp: invalid nested repetition operator: `**`"),
    ("*", "error parsing regexp: missing argument to repetition operator: `*`"),
    ("a{1001}", "error parsing regexp: invalid repeat count: `{1001}`"),
    ("[z-a]", "error parsing regexp: invalid character class range: `z-a`"),
    ("(?P<>a)", "error parsing regexp: invalid named capture: `(?P<>`"),
    ("a\\", "error parsing regexp: trailing backslash at end of expression: ``"),
]


@pytest.mark.parametrize("pattern,message", REFUSED)
def test_refused_regex_syntax_has_go_message(pattern, message):
    with pytest.raises(RegexError) as e:
        Matcher("l", "=~", pattern)
    assert str(e.value) == message
    assert isinstance(e.value, ValueError)
    assert rx.regex_error(pattern) is not None


def test_huge_compiled_programs_are_refused():
    """RE2's program-size limit refuses them before any matching (no backtracking to time out)."""
    with pytest.raises(RegexError, match="expression too large"):
        compile_regex("\\pL{1000}")
    compile_regex("\\pL{50}")  # realistic sizes compile
    huge = "|".join(f"host-{i}.example.com:9100" for i in range(20000))  # unescaped dots: a real program
    with pytest.raises(RegexError, match="expression too large") as e:
        compile_regex(huge)
    assert len(str(e.value)) < 400  # the error quotes a bounded fragment, not the whole pattern


@pytest.mark.parametrize("pattern,value", [
    ("(a+)+$", "a" * 28 + "b"),
    ("(a+)+$", "a" * 5000 + "b"),
    ("(x+x+)+y", "x" * 5000),
    ("(a|aa)+$", "a" * 5000 + "b"),
    ("(.*a){12}", "a" * 5000),
    ("(\\w+\\s?)+$", "word " * 1000 + "!"),
])
def test_backtracking_bombs_match_in_linear_time(pattern, value):
    """A backtracking engine takes minutes to years on these; RE2 milliseconds. The bound only tells
    the two apart (a loaded 2-core CI box must not fail it), it measures no speed."""
    m = Matcher("l", "=~", pattern)
    t0 = time.perf_counter()
    m.matches(value)
    m.matches_values([value] * 300)
    assert time.perf_counter() - t0 < 10.0, pattern


def test_long_matches_release_the_gil():
    """RE2 matching runs without the GIL, so a long match cannot stall the event loop thread."""
    m = Matcher("l", "=~", "(a+)+$")
    big = "a" * 30_000_000 + "b"
    ticks = [0]
    done = threading.Event()

    def spin():
        while not done.is_set():
            ticks[0] += 1

    th = threading.Thread(target=spin)
    th.start()
    try:
        time.sleep(0.05)
        t0, before = time.perf_counter(), ticks[0]
        assert not m.matches(big)
        elapsed, progressed = time.perf_counter() - t0, ticks[0] - before
    finally:
        done.set()
        th.join()
    assert elapsed < 5
    assert progressed > 1000, "the other thread made no progress while RE2 matched"


SHAPES = ["a", "", "ab", "a.*", ".*b", ".*a.*", ".*", ".+", "a|b", "a||b", "|", "a\\.b", "(?i)a", "a.b", "[ab]+", "(a|b)*c",
          "a\\.b|ab", "a\\|b", "a\\.*", ".*\\.b", "a\\\\.*", "\\Qa.b\\E", "\\d|a"]
WORDS = ["", "a", "b", "ab", "ba", "A", "a.b", "axb", "abc", "cab", "\n", "a\nb", "é", "aé", "ǅ", "a|b", "a...", "a\\", "a\\x",
         "x.b", "1"]


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(SHAPES), st.lists(st.sampled_from(WORDS), max_size=600))
def test_fast_paths_and_bulk_kernel_agree_with_re2(pattern, values):
    r = compile_regex(pattern)
    # the engine itself, bypassing the literal/prefix/set shortcuts
    want = [r._engine().Match(rx._ANCHOR_BOTH, v.encode(), 0, len(v.encode()))[0][0] >= 0 for v in values]
    assert [r.fullmatch(v) for v in values] == want
    assert r.match_mask(values).tolist() == want


def test_grafana_multi_value_selectors_are_set_lookups():
    """Alternations of (escaped) literals, as Grafana sends multi-value variables, need no regex
    program at all, so even 20000 values are accepted at once (a compiled program that size would
    exceed the limit)."""
    hosts = [f"host-{i}.example.com:9100" for i in range(20000)]
    m = Matcher("instance", "=~", "|".join(h.replace(".", "\\.") for h in hosts))
    assert m._rx._kind == "set" and m._rx._bool is None  # a set look-up: no RE2 program was compiled
    assert m.matches("host-19999.example.com:9100") and not m.matches("host-19999xexample.com:9100")
    assert m.matches_values(hosts[:5] + ["nope"]).tolist() == [True] * 5 + [False]


def test_compiled_regex_cache_is_bounded():
    for i in range(rx.CACHE_ENTRIES + 50):
        compile_regex(f"cache-{i}-[a-z]+")
    assert len(rx._cache) <= rx.CACHE_ENTRIES
    assert compile_regex("cache-0-[a-z]+").fullmatch("cache-0-x")
    with pytest.raises(RegexError):
        compile_regex("(?=cached-error)")
    with pytest.raises(RegexError):  # a cached refusal is refused again
        compile_regex("(?=cached-error)")


def test_go_expand_template():
    m = compile_regex("(?P<first>[a-z]+)-(\\d+)(x)?").match("abc-42")
    assert m is not None
    cases = {"$1": "abc", "${1}": "abc", "$first": "abc", "${first}": "abc", "$2$1": "42abc",
             "$3": "", "$9": "", "$1x": "", "${1}x": "abcx", "$$1": "$1", "$": "$", "${": "${", "a$-b": "a$-b",
             "$first_": "", "${first}_": "abc_", "$01": ""}
    for tpl, want in cases.items():
        assert expand_template(tpl, m) == want, tpl
