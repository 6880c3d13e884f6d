"""Request parameters of the Prometheus HTTP API: times, durations, limits, match[] selectors.

Parsing and error wording follow Prometheus 2.42's ``web/api/v1`` (``parseTime``,
``parseDuration``, ``parseLimitParam``, ``parseMatchersParam``) so clients see the same messages.
"""
from __future__ import annotations

import math
import re
from datetime import datetime, timezone
from typing import Sequence

from aiohttp import web
from multidict import MultiDict, MultiDictProxy

from promql.eval_selectors import selector_matchers
from storage.go_format import go_quote
from promql.parser import ParseError
from promql.parser import parse_metric_selector as parse_selector
from storage.matchers import Matcher
from turboprom.api_errors import ParamError
from turboprom.durations import parse_duration_ms

# Prometheus's defaults for optional time ranges (v1.MinTime / v1.MaxTime), in ms.
MIN_TIME_MS = (-(2**63) // 1000 + 1 + 62135596801) * 1000  # Go truncates MinInt64/1000 toward zero
MAX_TIME_MS = ((2**63 - 1) // 1000 - 62135596801) * 1000 + 999
# Their RFC 3339 renderings, which client_golang sends when no range is given.
MIN_TIME_TEXT = "-292273086-05-16T16:47:06Z"
MAX_TIME_TEXT = "292277025-08-18T07:12:54.999999999Z"

# strconv.ParseFloat's accepted decimal syntax (no whitespace, no underscores), plus inf/nan.
_GO_FLOAT = re.compile(r"[+-]?(?:(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?|(?i:inf|infinity|nan))\Z")
_RFC3339 = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2}):(\d{2})(?:\.(\d+))?(Z|[+-]\d{2}:\d{2})\Z"
)

MAX_RANGE_POINTS = 11000
# What Prometheus's parseTime yields for "NaN"/"Inf" on amd64 (int64 overflow of the fraction).
NAN_TIME_MS = -9223372036854


def invalid_param(name: str, msg: str) -> ParamError:
    return ParamError(f"invalid parameter {go_quote(name)}: {msg}")


def _go_float(s: str) -> float | None:
    if not _GO_FLOAT.match(s):
        return None
    try:
        return float(s)
    except ValueError:
        return None


def _round_half_away(x: float) -> float:
    return math.floor(x + 0.5) if x >= 0 else -math.floor(-x + 0.5)


def parse_time(s: str) -> int:
    """Float Unix seconds or RFC 3339 -> int64 ms. Raises ValueError with Prometheus's text."""
    f = _go_float(s)
    if f is not None:
        if math.isnan(f) or math.isinf(f):
            # Prometheus accepts these; Go's int64(NaN) conversions end at this instant.
            return NAN_TIME_MS
        whole = math.trunc(f)
        frac_ms = _round_half_away((f - whole) * 1000)
        ms = int(whole) * 1000 + int(frac_ms)
        return max(MIN_TIME_MS, min(MAX_TIME_MS, ms))
    m = _RFC3339.match(s)
    if m:
        y, mo, d, h, mi, sec, frac, tz = m.groups()
        try:
            if tz == "Z":
                tzinfo = timezone.utc
            else:
                sign = 1 if tz[0] == "+" else -1
                from datetime import timedelta

                tzinfo = timezone(sign * timedelta(hours=int(tz[1:3]), minutes=int(tz[4:6])))
            dt = datetime(int(y), int(mo), int(d), int(h), int(mi), int(sec), tzinfo=tzinfo)
        except ValueError:
            raise ValueError(f"cannot parse {go_quote(s)} to a valid timestamp") from None
        ms = int(dt.timestamp()) * 1000
        if frac:
            ms += int((frac + "000")[:3])
        return ms
    if s == MIN_TIME_TEXT:
        return MIN_TIME_MS
    if s == MAX_TIME_TEXT:
        return MAX_TIME_MS
    raise ValueError(f"cannot parse {go_quote(s)} to a valid timestamp")


def parse_duration(s: str) -> int:
    """Float seconds or a Prometheus duration (``5m``) -> int ms (truncated like Go)."""
    f = _go_float(s)
    if f is not None:
        ns = f * 1e9
        if math.isnan(ns) or ns > 2**63 - 1 or ns < -(2**63):
            raise ValueError(f"cannot parse {go_quote(s)} to a valid duration. It overflows int64")
        return int(int(ns) / 1_000_000)  # toward zero, as Go's int64 division
    try:
        return parse_duration_ms(s)
    except ValueError:
        raise ValueError(f"cannot parse {go_quote(s)} to a valid duration") from None


class Params:
    """Form values like Go's ``r.FormValue``/``r.Form``: POST body first, then the URL query."""

    def __init__(self, query: MultiDictProxy[str], body: MultiDictProxy[str] | None = None):
        md: MultiDict[str] = MultiDict()
        if body is not None:
            for k, v in body.items():
                if isinstance(v, str):
                    md.add(k, v)
        md.extend(query)
        self._md = md

    @classmethod
    async def from_request(cls, request: web.Request) -> "Params":
        body = None
        if request.method in ("POST", "PUT") and request.content_type in (
            "application/x-www-form-urlencoded",
            "multipart/form-data",
        ):
            body = await request.post()
        return cls(request.query, body)  # type: ignore[arg-type]

    def get(self, name: str, default: str = "") -> str:
        return self._md.get(name, default)

    def getall(self, name: str) -> list[str]:
        return list(self._md.getall(name, []))

    def time(self, name: str, default_ms: int) -> int:
        """An optional time parameter (Prometheus's ``parseTimeParam``)."""
        val = self.get(name)
        if val == "":
            return default_ms
        try:
            return parse_time(val)
        except ValueError as e:
            raise invalid_param(name, f"Invalid time value for '{name}': {e}") from None

    def required_time(self, name: str) -> int:
        try:
            return parse_time(self.get(name))
        except ValueError as e:
            raise invalid_param(name, str(e)) from None

    def duration(self, name: str) -> int | None:
        val = self.get(name)
        if val == "":
            return None
        try:
            return parse_duration(val)
        except ValueError as e:
            raise invalid_param(name, str(e)) from None

    def duration_seconds(self, name: str) -> float | None:
        """A duration parameter as float seconds, keeping sub-millisecond precision (timeouts)."""
        val = self.get(name)
        if val == "":
            return None
        f = _go_float(val)
        if f is not None and not math.isnan(f):
            if abs(f) * 1e9 > 2**63 - 1:
                raise invalid_param(name, f"cannot parse {go_quote(val)} to a valid duration. It overflows int64")
            return f
        try:
            return parse_duration_ms(val) / 1000.0
        except ValueError:
            raise invalid_param(name, f"cannot parse {go_quote(val)} to a valid duration") from None

    def limit(self, name: str = "limit") -> int:
        """0 = no limit."""
        val = self.get(name)
        if val == "":
            return 0
        if not re.fullmatch(r"[+-]?\d+", val):
            raise invalid_param(name, f"strconv.Atoi: parsing {go_quote(val)}: invalid syntax")
        n = int(val)
        if n < 0:
            raise invalid_param(name, "limit must be non-negative")
        return n

    def boolean(self, name: str) -> bool | None:
        """A true/false parameter (Go ``strconv.ParseBool`` spellings); None when absent. Anything else
        is the caller's mistake and is refused, never read as false."""
        val = self.get(name)
        if val == "":
            return None
        if val in ("1", "t", "T", "true", "TRUE", "True"):
            return True
        if val in ("0", "f", "F", "false", "FALSE", "False"):
            return False
        raise invalid_param(name, f"strconv.ParseBool: parsing {go_quote(val)}: invalid syntax (use true or false)")


def parse_query(query: str, max_depth: int | None = None) -> object:
    """Parse PromQL; ValueError carries Prometheus's message (``line:col: parse error: ...``).
    Expressions nested deeper than ``max_depth`` (None: the default, 256) are refused before they are
    parsed (promql/query_guard.py)."""
    from promql import query_guard
    from promql.errors import BadData

    try:
        return query_guard.parse(query, query_guard.DEFAULT_MAX_DEPTH if max_depth is None else max_depth)
    except BadData as e:
        raise ValueError(str(e)) from None


SELECTOR_MAX_DEPTH = 16
SELECTOR_MAX_LENGTH = 256 * 1024


def parse_metric_selector(text: str) -> list[list[Matcher]]:
    """A series selector (``foo{a="b"}``) -> its matcher set(s). Raises ValueError."""
    from promql import query_guard
    from promql.errors import BadData

    if len(text) > SELECTOR_MAX_LENGTH:  # parsing holds the GIL
        raise ValueError(f"1:1: parse error: selector is {len(text)} characters, more than the limit of {SELECTOR_MAX_LENGTH}")
    try:
        query_guard.check(text, SELECTOR_MAX_DEPTH)  # a selector is shallow: refuse deep text before parsing
    except BadData as e:
        raise ValueError(str(e)) from None
    try:
        node = parse_selector(text)
    except ParseError as e:
        raise ValueError(str(e)) from None
    try:
        return selector_matchers(node)
    except ValueError as e:
        raise ValueError(f"1:1: parse error: {e}") from None


def parse_matchers_param(values: Sequence[str]) -> list[list[Matcher]]:
    """``match[]`` values -> matcher sets; each set must have a matcher that rejects ``""``."""
    sets: list[list[Matcher]] = []
    for s in values:
        sets.extend(parse_metric_selector(s))
    for ms in sets:
        if not any(not m.matches_empty for m in ms):
            raise ValueError("match[] must contain at least one non-empty matcher")
    return sets


def unescape_label_name(name: str) -> str:
    """Grafana/Prometheus ``U__`` value-encoding escaping of UTF-8 label names.

    ``U__`` prefix; ``__`` is ``_``; ``_<hex>_`` is the code point <hex>; other chars literal.
    Invalid escapes leave the name unchanged (as Prometheus's ``UnescapeName`` does)."""
    if not name.startswith("U__"):
        return name
    s = name[3:]
    out: list[str] = []
    i = 0
    while i < len(s):
        c = s[i]
        if c != "_":
            out.append(c)
            i += 1
            continue
        if i + 1 < len(s) and s[i + 1] == "_":
            out.append("_")
            i += 2
            continue
        j = s.find("_", i + 1)
        if j < 0:
            return name
        hexpart = s[i + 1 : j]
        try:
            cp = int(hexpart, 16)
            if not hexpart or cp > 0x10FFFF:
                return name
            out.append(chr(cp))
        except ValueError:
            return name
        i = j + 1
    return "".join(out)
