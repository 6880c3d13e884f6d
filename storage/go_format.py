"""Go's ``strconv.Quote`` and ``strconv.FormatFloat`` for error messages, annotations, printed PromQL,
label values, alert templates and API values: one implementation each, used by the evaluator, the
parser, the printer, the planner's rules and templates, the HTTP API and ingest (histogram bounds
as ``le`` label values). It lives in the leaf package so that every stage can import it.

Hand-written because Python has no Go-compatible quoting (``repr`` and ``json.dumps`` escape
differently: ``\\x07`` vs ``\\a``, ASCII-only output) and its float formatting differs from Go's in
the exponent form (``1e-05`` vs ``1e-05`` is shared, but ``1e+06`` / ``%g`` thresholds, ``+Inf`` and
``NaN`` spellings and the shortest-digit rules are Go's own).
"""
from __future__ import annotations

import math
import re

import numpy as np

_SIMPLE = {'"': '\\"', "\\": "\\\\", "\a": "\\a", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r",
           "\t": "\\t", "\v": "\\v"}


def _rune(ch: str) -> str:
    esc = _SIMPLE.get(ch)
    if esc is not None:
        return esc
    o = ord(ch)
    if 0xDC80 <= o <= 0xDCFF:  # an invalid UTF-8 byte carried as a surrogate escape
        return f"\\x{o - 0xDC00:02x}"
    if 0xD800 <= o <= 0xDFFF:  # a lone surrogate: not valid UTF-8 in Go either, quoted byte by byte
        return "".join(f"\\x{b:02x}" for b in ch.encode("utf-8", "surrogatepass"))
    if ch == " " or ch.isprintable():  # unicode.IsPrint: letters, marks, numbers, punctuation, symbols, ASCII space
        return ch
    if o < 0x80:
        return f"\\x{o:02x}"
    if o < 0x10000:
        return f"\\u{o:04x}"
    return f"\\U{o:08x}"


def go_quote(s: str) -> str:
    """Go ``strconv.Quote``: double-quoted, Go escapes (``\\a \\b \\f \\n \\r \\t \\v``, ``\\xNN``,
    ``\\uNNNN``, ``\\UNNNNNNNN``), printable Unicode kept as it is."""
    if s.isprintable() and '"' not in s and "\\" not in s:  # the common case: nothing to escape
        return f'"{s}"'
    return '"' + "".join(map(_rune, s)) + '"'


def go_quote_bytes(b: bytes) -> str:
    """Go ``strconv.Quote`` of a byte string: valid UTF-8 as ``go_quote``, each invalid byte ``\\xNN``."""
    return go_quote(b.decode("utf-8", "surrogateescape"))


# --- strconv.FormatFloat ----------------------------------------------------------------------------
def _special(v: float) -> str | None:
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return None


def format_float_f(v: float) -> str:
    """Go ``strconv.FormatFloat(v, 'f', -1, 64)``: shortest round-trip digits, never an exponent
    (``-0`` keeps its sign); ``NaN``, ``+Inf``, ``-Inf`` as Prometheus spells them."""
    return _special(v) or np.format_float_positional(v, unique=True, trim="-")


def format_float_e(v: float) -> str:
    """Go ``strconv.FormatFloat(v, 'e', -1, 64)`` (``1.5e+00``), as Prometheus renders alert values."""
    return _special(v) or np.format_float_scientific(float(v), unique=True, exp_digits=2).replace(".e", "e")


def go_exponent(e: int) -> str:
    """Go's exponent suffix: sign always, at least two digits (``e+06``, ``e-05``)."""
    return f"e{'-' if e < 0 else '+'}{abs(e):02d}"


def _shortest(v: float) -> tuple[str, int]:
    """Shortest round-trip decimal digits of |v| and the decimal exponent of the first digit."""
    r = repr(abs(v))
    if "e" in r:
        mant, _, ex = r.partition("e")
        digits = mant.replace(".", "").rstrip("0") or "0"
        return digits, int(ex)
    whole, _, frac = r.partition(".")
    frac = "" if frac == "0" else frac
    if whole != "0":
        digits = (whole + frac).rstrip("0")
        return digits, len(whole) - 1
    stripped = frac.lstrip("0")
    return stripped.rstrip("0"), -(len(frac) - len(stripped)) - 1


def format_float_g(v: float, prec: int = -1) -> str:
    """Go ``strconv.FormatFloat(v, 'g', prec, 64)``; prec -1 (also ``fmt``'s ``%v`` of a float64):
    shortest digits, exponent form when the exponent is < -4 or >= 6 (``1e+06``, ``123456``)."""
    special = _special(v)
    if special is not None:
        return special
    if prec >= 0:
        text = f"{v:.{max(prec, 1)}g}"
        return re.sub(r"e([+-])(\d+)", lambda m: go_exponent(int(m.group(1) + m.group(2))), text)
    if v == 0:
        return "-0" if math.copysign(1.0, v) < 0 else "0"
    digits, exp = _shortest(v)
    sign = "-" if v < 0 else ""
    if exp < -4 or exp >= 6:
        mant = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
        return f"{sign}{mant}{go_exponent(exp)}"
    if exp < 0:
        return f"{sign}0.{'0' * (-exp - 1)}{digits}"
    if exp + 1 >= len(digits):
        return sign + digits + "0" * (exp + 1 - len(digits))
    return f"{sign}{digits[:exp + 1]}.{digits[exp + 1:]}"
