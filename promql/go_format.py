"""Go's ``strconv.Quote`` for error messages, annotations and printed PromQL: one implementation,
used by the evaluator, the parser, the printer and the HTTP API.

Hand-written because Python has no Go-compatible quoting: ``repr`` and ``json.dumps`` escape
differently (``\\x07`` vs ``\\a``, ASCII-only output).
"""
from __future__ import annotations

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
