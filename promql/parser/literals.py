"""PromQL literal values: numbers as Go's ``strconv`` reads them, durations as
``model.ParseDuration`` reads them, quoted strings as Go unquotes them.

String values keep Go's byte semantics: an escape like ``\\xff`` that makes invalid UTF-8 becomes a
surrogate escape in the Python str (``value.encode("utf-8", "surrogateescape")`` gives the bytes).
"""
from __future__ import annotations

import math
import re

from storage.go_format import go_quote

_OCTAL = re.compile(r"0[0-7_]*")
_DECIMAL_INT = re.compile(r"[1-9](?:_?[0-9])*|0")
_PREFIXED = re.compile(r"0[xX](?:_?[0-9a-fA-F])+|0[oO](?:_?[0-7])+|0[bB](?:_?[01])+")
_FLOAT = re.compile(r"(?:[0-9](?:_?[0-9])*)?\.?(?:[0-9](?:_?[0-9])*)?(?:[eE][+-]?[0-9](?:_?[0-9])*)?")
_INT64_MAX = 2**63 - 1


class LiteralError(ValueError):
    pass


_PLAIN_DECIMAL = re.compile(r"(?:[1-9][0-9]*|0)(?:\.[0-9]+)?")
_PLAIN_DURATION = re.compile(r"([0-9]+)(ms|[smhdwy])")


def parse_number(text: str) -> float:
    """Prometheus's ``parser.number``: ``strconv.ParseInt(s, 0, 64)``, else ``strconv.ParseFloat``."""
    if _PLAIN_DECIMAL.fullmatch(text):  # the common case: both readings give the nearest float
        return float(text)
    if _PREFIXED.fullmatch(text) or _DECIMAL_INT.fullmatch(text):
        v = int(text.replace("_", ""), 0)
        if v <= _INT64_MAX:
            return float(v)
    elif _OCTAL.fullmatch(text) and "_" not in text[1:2]:
        v = int(text.replace("_", "") or "0", 8)
        if v <= _INT64_MAX:
            return float(v)
    low = text.lower()
    if low in ("inf", "+inf", "infinity"):
        return math.inf
    if low == "nan":
        return math.nan
    if text and _FLOAT.fullmatch(text) and any(c.isdigit() for c in text):
        v = float(text.replace("_", ""))
        if math.isinf(v):
            raise LiteralError(f"strconv.ParseFloat: parsing {go_quote(text)}: value out of range")
        return v
    if re.fullmatch(r"0[xX][0-9a-fA-F_]+", text):
        v = int(text.replace("_", ""), 16)
        return float(v)
    raise LiteralError(f"strconv.ParseFloat: parsing {go_quote(text)}: invalid syntax")


_UNITS = {"y": (1, 365 * 86_400_000), "w": (2, 7 * 86_400_000), "d": (3, 86_400_000), "h": (4, 3_600_000),
          "m": (5, 60_000), "s": (6, 1000), "ms": (7, 1)}
_MAX_NS = 2**63 - 1


def parse_duration_ms(text: str) -> int:
    """``model.ParseDuration``: units y w d h m s ms, largest first, each at most once; ``0`` alone
    is allowed. Milliseconds; raises LiteralError with Prometheus's message."""
    m = _PLAIN_DURATION.fullmatch(text)
    if m is not None:  # one unit: the common case
        v, mult = int(m.group(1)), _UNITS[m.group(2)][1]
        if v <= _MAX_NS // (mult * 1_000_000):
            return v * mult
    if text == "0":
        return 0
    if text == "":
        raise LiteralError("empty duration string")
    rest = text
    total_ns = 0
    last = 0
    while rest:
        i = 0
        while i < len(rest) and rest[i].isdigit() and rest[i].isascii():
            i += 1
        if i == 0:
            raise LiteralError(f"not a valid duration string: {go_quote(text)}")
        v = int(rest[:i])
        rest = rest[i:]
        j = 0
        while j < len(rest) and not (rest[j].isdigit() and rest[j].isascii()):
            j += 1
        if j == 0:
            raise LiteralError(f"not a valid duration string: {go_quote(text)}")
        unit = rest[:j]
        rest = rest[j:]
        if unit not in _UNITS:
            raise LiteralError(f"unknown unit {go_quote(unit)} in duration {go_quote(text)}")
        order, mult = _UNITS[unit]
        if order <= last:
            raise LiteralError(f"not a valid duration string: {go_quote(text)}")
        last = order
        mult_ns = mult * 1_000_000
        if v > (1 << 63) // mult_ns:
            raise LiteralError("duration out of range")
        total_ns += v * mult_ns
        if total_ns > _MAX_NS:
            raise LiteralError("duration out of range")
    return total_ns // 1_000_000


_SIMPLE = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v", "\\": "\\", "'": "'",
           '"': '"'}


def unquote(text: str) -> str:
    """Go's ``strconv.Unquote`` of a PromQL string token (the lexer has validated it). Bytes that
    are not UTF-8 come back surrogate-escaped."""
    q = text[0]
    body = text[1:-1]
    if q == "`":
        return body.replace("\r", "")
    if "\\" not in body:
        return body
    out = bytearray()
    i, n = 0, len(body)
    while i < n:
        c = body[i]
        if c != "\\":
            out += c.encode("utf-8", "surrogateescape")
            i += 1
            continue
        e = body[i + 1]
        if e in _SIMPLE:
            if (e == "'" and q == '"') or (e == '"' and q == "'"):
                raise LiteralError("invalid syntax")
            out += _SIMPLE[e].encode()
            i += 2
        elif e == "x":
            out.append(int(body[i + 2:i + 4], 16))
            i += 4
        elif e in "01234567":
            v = int(body[i + 1:i + 4], 8)
            if v > 255:
                raise LiteralError("invalid syntax")
            out.append(v)
            i += 4
        elif e in "uU":
            k = 4 if e == "u" else 8
            out += chr(int(body[i + 2:i + 2 + k], 16)).encode("utf-8")
            i += 2 + k
        else:
            raise LiteralError("invalid syntax")
    return out.decode("utf-8", "surrogateescape")


def valid_label_name(name: str) -> bool:
    """Prometheus's ``model.LabelName.IsValid`` (UTF-8 names): non-empty and valid UTF-8
    (``utf8.ValidString``). A string value keeps bytes that are not UTF-8 as surrogate escapes
    (see :func:`unquote`), which do not encode; U+FFFD itself is a valid character."""
    if not name:
        return False
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


__all__ = ["LiteralError", "parse_number", "parse_duration_ms", "unquote", "valid_label_name"]
