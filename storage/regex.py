"""Prometheus regular expressions: the one place a user-supplied regex is compiled.

Every regex a client can send (label matchers ``=~``/``!~`` in queries and ``match[]``,
``label_replace``, ``info()`` selectors, ``relabel_configs``) goes through :func:`compile_regex`,
which compiles it with RE2 (the ``google-re2`` binding), the engine Go's ``regexp`` follows, with
Prometheus's semantics:

* Go RE2 syntax, as written: inline flags anywhere (``a|(?i)b``), ``\\pL``, ``[[:alpha:]]``,
  ``(?P<name>...)`` and ``(?<name>...)``, ``\\Q...\\E``; no backreferences, no look-around, no
  ``\\C`` (Go refuses it) and no ``(?x)``;
* fully anchored and with ``.`` matching newline, i.e. ``^(?s:pattern)$`` (Prometheus 3's
  ``labels.NewFastRegexMatcher``, ``relabel.NewRegexp`` and ``label_replace``);
* matching time linear in the input (RE2 never backtracks), and the binding releases the GIL
  while it matches;
* a refused pattern raises :class:`RegexError` whose text reads like Go's
  (``error parsing regexp: invalid or unsupported Perl syntax: `(?=```);
* a compiled program is bounded (:data:`MAX_PROGRAM_BYTES`; beyond it the pattern is refused as
  ``expression too large``), so compiling, which holds the GIL, stays short.

Compiled patterns are cached (bounded LRU). Cheap shapes skip the regex engine, as Prometheus's
``FastRegexMatcher`` does: a literal or an alternation of literals is a set look-up, ``.*`` and
``.+`` need no engine, ``lit.*``, ``.*lit`` and ``.*lit.*`` are prefix/suffix/substring tests.
:meth:`Regex.match_mask` tests a whole list of label values at once (Arrow's RE2 kernel for large
lists, with the GIL released).

Go's ``Regexp.ExpandString`` (``$1``, ``${1}``, ``$name``, ``${name}``, ``$$``), which
``label_replace`` and relabeling use for replacements, is :func:`expand_template`.
"""
from __future__ import annotations

import threading
import unicodedata
from collections import OrderedDict
from typing import Sequence

import numpy as np
import re2

# A compiled program may use at most this much memory (RE2's max_mem): about 120k instructions,
# compiled in ~50 ms. Larger patterns (``\pL{200}``) are refused with Go's "expression too large".
MAX_PROGRAM_BYTES = 2 << 20
CACHE_ENTRIES = 512  # compiled patterns kept (LRU)
ARROW_MIN_VALUES = 256  # from this many values on, match_mask runs in Arrow's RE2 kernel

_ANCHOR_BOTH = re2._Anchor.ANCHOR_BOTH
_UNANCHORED = re2._Anchor.UNANCHORED
_META = frozenset("\\.+*?()|[]{}^$")


class RegexError(ValueError):
    """A pattern Go's regexp (RE2 syntax) refuses; ``str()`` is Go's ``error parsing regexp: ...``."""

    def __init__(self, message: str, pattern: str) -> None:
        super().__init__(message)
        self.pattern = pattern


# RE2 (C++) error codes -> Go's regexp/syntax ErrorCode text.
_GO_CODES = {
    "invalid escape sequence": "invalid escape sequence",
    "invalid character class": "invalid character class",
    "invalid character class range": "invalid character class range",
    "missing ]": "missing closing ]",
    "missing )": "missing closing )",
    "unexpected )": "unexpected )",
    "trailing \\": "trailing backslash at end of expression",
    "no argument for repetition operator": "missing argument to repetition operator",
    "invalid repetition size": "invalid repeat count",
    "bad repetition operator": "invalid nested repetition operator",
    "invalid perl operator": "invalid or unsupported Perl syntax",
    "invalid UTF-8": "invalid UTF-8",
    "invalid named capture group": "invalid named capture",
}


_FRAGMENT_MAX = 200  # characters of the offending expression quoted in an error


def _fragment(expr: str) -> str:
    if len(expr) <= _FRAGMENT_MAX:
        return expr
    return f"{expr[:_FRAGMENT_MAX]}...({len(expr)} characters)"


def _go_error(pattern: str, raw: str) -> RegexError:
    if raw.startswith("pattern too large"):
        return RegexError(f"error parsing regexp: expression too large: `{_fragment(pattern)}` (compiled program "
                          f"over {MAX_PROGRAM_BYTES >> 20} MiB)", pattern)
    code, sep, expr = raw.partition(": ")
    go = _GO_CODES.get(code)
    if go is None:
        return RegexError(f"error parsing regexp: {_fragment(raw)}", pattern)
    return RegexError(f"error parsing regexp: {go}: `{_fragment(expr) if sep else ''}`", pattern)


def _options(capture: bool) -> re2.Options:
    o = re2.Options()
    o.log_errors = False
    o.dot_nl = True  # Prometheus wraps every pattern in (?s:...)
    o.max_mem = MAX_PROGRAM_BYTES
    o.never_capture = not capture
    return o


_BOOL_OPTIONS = _options(capture=False)
_CAPTURE_OPTIONS = _options(capture=True)


def _utf8(s: str) -> bytes:
    try:
        return s.encode()
    except UnicodeEncodeError:
        return s.encode("utf-8", "surrogatepass")


def _text(b: bytes) -> str:
    return b.decode("utf-8", "surrogatepass")


def _go_only_check(pattern: str) -> None:
    """What Go refuses but C++ RE2 accepts: the ``\\C`` (any byte) escape."""
    i = pattern.find("\\")
    while i >= 0:
        nxt = pattern[i + 1:i + 2]
        if nxt == "C":
            raise RegexError("error parsing regexp: invalid escape sequence: `\\C`", pattern)
        if nxt == "Q":  # \Q...\E is literal text
            end = pattern.find("\\E", i + 2)
            if end < 0:
                return
            i = end
        i = pattern.find("\\", i + 2)


def _literal(s: str) -> str | None:
    """The text ``s`` matches if it is a literal: no metacharacters except backslash-escaped ASCII
    punctuation (``host\\.example\\.com``, as Grafana escapes variable values); else None."""
    if "\\" not in s:
        return None if any(c in _META for c in s) else s
    out: list[str] = []
    i, n = 0, len(s)
    while i < n:
        c = s[i]
        if c == "\\":
            if i + 1 >= n:
                return None
            e = s[i + 1]
            if not (e.isascii() and not e.isalnum() and e != "_" and e.isprintable()):
                return None  # \d, \pL, \Q, \1, ...: not a literal
            out.append(e)
            i += 2
            continue
        if c in _META:
            return None
        out.append(c)
        i += 1
    return "".join(out)


def _alternatives(s: str) -> list[str] | None:
    """Split on unescaped ``|`` when every alternative is a literal."""
    parts: list[str] = []
    start, i, n = 0, 0, len(s)
    while i < n:
        if s[i] == "\\":
            i += 2
            continue
        if s[i] == "|":
            parts.append(s[start:i])
            start = i + 1
        i += 1
    parts.append(s[start:])
    lits = [_literal(p) for p in parts]
    return None if any(x is None for x in lits) else lits  # type: ignore[return-value]


def _shape(pattern: str) -> tuple[str, object]:
    """A matcher for common shapes that needs no regex engine, or ("regex", None). Every shape is
    valid RE2 by construction, so it needs no compiling either."""
    if pattern == ".*":
        return "any", None
    if pattern == ".+":
        return "nonempty", None
    alts = _alternatives(pattern)
    if alts is not None:
        return ("equal", alts[0]) if len(alts) == 1 else ("set", frozenset(alts))
    head, tail = pattern.startswith(".*"), pattern.endswith(".*") and not _escaped_at(pattern, len(pattern) - 2)
    if head and tail and len(pattern) >= 4:
        mid = _literal(pattern[2:-2])
        if mid is not None:
            return "contains", mid
    if tail:
        pre = _literal(pattern[:-2])
        if pre is not None:
            return "prefix", pre
    if head:
        suf = _literal(pattern[2:])
        if suf is not None:
            return "suffix", suf
    return "regex", None


def _escaped_at(s: str, i: int) -> bool:
    """Is s[i] preceded by an odd number of backslashes?"""
    k = i
    while k > 0 and s[k - 1] == "\\":
        k -= 1
    return (i - k) % 2 == 1


def _compile(pattern: str, options: re2.Options) -> "re2._re2.RE2":
    _go_only_check(pattern)
    try:
        r = re2._re2.RE2(_utf8(pattern), options)
    except UnicodeEncodeError:
        raise RegexError(f"error parsing regexp: invalid UTF-8: `{_fragment(pattern)}`", pattern) from None
    if not r.ok():
        raise _go_error(pattern, _text(r.error()))
    return r


class RegexMatch:
    """A successful full match: the capture groups (``None`` for one that did not take part)."""

    __slots__ = ("regex", "_groups")

    def __init__(self, regex: "Regex", groups: list[str | None]) -> None:
        self.regex = regex
        self._groups = groups

    def group(self, key: int | str = 0) -> str | None:
        if isinstance(key, str):
            idx = self.regex.groupindex.get(key)
            if idx is None:
                raise IndexError(f"no such group {key!r}")
            key = idx
        if not 0 <= key < len(self._groups):
            raise IndexError(f"no such group {key}")
        return self._groups[key]

    def expand(self, template: str) -> str:
        return expand_template(template, self)


class Regex:
    """A compiled, fully anchored Prometheus regex. Build with :func:`compile_regex`."""

    __slots__ = ("pattern", "_bool", "_cap", "_ngroups", "_groupindex", "_kind", "_arg", "_lock")

    def __init__(self, pattern: str) -> None:
        self.pattern = pattern
        self._kind, self._arg = _shape(pattern)
        self._bool: re2._re2.RE2 | None = None
        if self._kind == "regex":  # shapes are valid by construction; anything else is compiled now
            self._bool = _compile(pattern, _BOOL_OPTIONS)
        self._cap: re2._re2.RE2 | None = None
        self._ngroups = 0
        self._groupindex: dict[str, int] = {}
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"Regex({self.pattern!r})"

    def __reduce__(self):  # pickling and deep copies recompile (the RE2 object itself cannot be copied)
        return compile_regex, (self.pattern,)

    # --- boolean matching -------------------------------------------------------------------

    def fullmatch(self, s: str) -> bool:
        """Does the whole of ``s`` match?"""
        k = self._kind
        if k == "equal":
            return s == self._arg
        if k == "any":
            return True
        if k == "nonempty":
            return s != ""
        if k == "set":
            return s in self._arg  # type: ignore[operator]
        if k == "prefix":
            return s.startswith(self._arg)  # type: ignore[arg-type]
        if k == "suffix":
            return s.endswith(self._arg)  # type: ignore[arg-type]
        if k == "contains":
            return self._arg in s  # type: ignore[operator]
        b = _utf8(s)
        return self._bool.Match(_ANCHOR_BOTH, b, 0, len(b))[0][0] >= 0  # type: ignore[union-attr]

    def match_mask(self, values: Sequence[str]) -> np.ndarray:
        """``fullmatch`` of every value, as a bool array (len(values),)."""
        if not isinstance(values, list):
            values = list(values)
        n = len(values)
        k = self._kind
        if k == "any":
            return np.ones(n, dtype=bool)
        if k != "regex" or n < ARROW_MIN_VALUES:
            return np.fromiter((self.fullmatch(v) for v in values), dtype=bool, count=n)
        try:
            import pyarrow as pa
            import pyarrow.compute as pc

            arr = pa.array(values, type=pa.string())
            hit = pc.match_substring_regex(arr, "^(?s:" + self.pattern + ")$")
            return np.asarray(hit.to_numpy(zero_copy_only=False), dtype=bool)
        except Exception:  # values Arrow cannot hold (lone surrogates), or its RE2 refuses: one by one
            m = self._bool.Match  # type: ignore[union-attr]
            out = np.empty(n, dtype=bool)
            for i, v in enumerate(values):
                b = _utf8(v)
                out[i] = m(_ANCHOR_BOTH, b, 0, len(b))[0][0] >= 0
            return out

    def search(self, s: str) -> tuple[int, int] | None:
        """Unanchored (Go's ``MatchString``): the (start, end) character span of the leftmost
        match in ``s``, or None. For patterns that are searched, not matched whole."""
        b = _utf8(s)
        a, e = self._engine().Match(_UNANCHORED, b, 0, len(b))[0]
        if a < 0:
            return None
        return len(_text(b[:a])), len(_text(b[:e]))

    # --- submatches -------------------------------------------------------------------------

    def _engine(self) -> "re2._re2.RE2":
        """The boolean RE2 program (compiled on first use for the shapes that skip it)."""
        r = self._bool
        if r is None:
            with self._lock:
                if self._bool is None:
                    self._bool = _compile(self.pattern, _BOOL_OPTIONS)
                r = self._bool
        return r

    def _capturing(self) -> "re2._re2.RE2":
        cap = self._cap
        if cap is None:
            with self._lock:
                if self._cap is None:
                    cap = _compile(self.pattern, _CAPTURE_OPTIONS)
                    self._ngroups = cap.NumberOfCapturingGroups()
                    self._groupindex = {_text(name): idx for name, idx in cap.NamedCapturingGroups()}
                    self._cap = cap
                cap = self._cap
        return cap

    @property
    def groups(self) -> int:
        """Number of capture groups."""
        if self._kind != "regex":
            return 0  # a shape has no parentheses
        self._capturing()
        return self._ngroups

    @property
    def groupindex(self) -> dict[str, int]:
        """Capture group name -> index (the leftmost group of a repeated name)."""
        if self._kind != "regex":
            return {}
        self._capturing()
        return self._groupindex

    def match(self, s: str) -> RegexMatch | None:
        """The full match of ``s`` with its capture groups, or None."""
        if self._kind != "regex":
            return RegexMatch(self, [s]) if self.fullmatch(s) else None
        b = _utf8(s)
        spans = self._capturing().Match(_ANCHOR_BOTH, b, 0, len(b))
        if spans[0][0] < 0:
            return None
        return RegexMatch(self, [None if a < 0 else _text(b[a:e]) for a, e in spans])


_cache: "OrderedDict[str, Regex | RegexError]" = OrderedDict()
_cache_lock = threading.Lock()


def compile_regex(pattern: str) -> Regex:
    """The compiled Prometheus regex for ``pattern`` (cached). Raises :class:`RegexError`."""
    with _cache_lock:
        hit = _cache.get(pattern)
        if hit is not None:
            _cache.move_to_end(pattern)
    if hit is None:
        try:
            hit = Regex(pattern)
        except RegexError as e:
            hit = e
        with _cache_lock:
            _cache[pattern] = hit
            while len(_cache) > CACHE_ENTRIES:
                _cache.popitem(last=False)
    if isinstance(hit, RegexError):
        raise RegexError(str(hit), pattern)
    return hit


def regex_error(pattern: str) -> RegexError | None:
    """The error compiling ``pattern`` would raise, or None when it compiles."""
    try:
        compile_regex(pattern)
    except RegexError as e:
        return e
    return None


def quote_meta(s: str) -> str:
    """Go's ``regexp.QuoteMeta``: backslash-escape every regexp metacharacter."""
    return "".join("\\" + c if c in _META else c for c in s)


# --- Go's Regexp.ExpandString ----------------------------------------------------------------

def _is_name_char(ch: str) -> bool:
    # Go: r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r)
    return ch == "_" or ch.isalpha() or unicodedata.category(ch) == "Nd"


def _extract(template: str) -> tuple[str, int, str] | None:
    """Parse "name" / "{name}" after a "$" as Go's regexp.extract does: (name, num, rest)."""
    if not template:
        return None
    brace = template[0] == "{"
    s = template[1:] if brace else template
    i = 0
    while i < len(s) and _is_name_char(s[i]):
        i += 1
    if i == 0:
        return None
    name = s[:i]
    if brace:
        if i >= len(s) or s[i] != "}":
            return None
        i += 1
    num = -1
    if name.isascii() and name.isdigit() and not (name[0] == "0" and len(name) > 1) and len(name) <= 8:
        num = int(name)
    return name, num, s[i:]


def expand_template(template: str, m: RegexMatch) -> str:
    """Go's ``Regexp.ExpandString``: ``$1``, ``${1}``, ``$name``, ``${name}``; ``$$`` is ``$``; a
    group that does not exist or did not take part expands to ""; a malformed ``$`` stays."""
    out: list[str] = []
    groupindex = m.regex.groupindex
    ngroups = m.regex.groups
    while template:
        k = template.find("$")
        if k < 0:
            break
        out.append(template[:k])
        template = template[k + 1:]
        if template.startswith("$"):
            out.append("$")
            template = template[1:]
            continue
        ext = _extract(template)
        if ext is None:
            out.append("$")
            continue
        name, num, template = ext
        if num >= 0:
            if num <= ngroups:
                out.append(m.group(num) or "")
        elif name in groupindex:
            out.append(m.group(groupindex[name]) or "")
    out.append(template)
    return "".join(out)
