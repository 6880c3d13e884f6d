"""Go/PromQL string literals decoded to the bytes they denote.

A ``\\xff`` escape is one raw byte in Go, not the code point U+00FF. Where that difference matters
(label name validation against the query text), the literal is decoded from the text here. Hand-written because no library decodes Go string-literal escapes to raw bytes.
"""
from __future__ import annotations

_SIMPLE_ESC = {"a": 7, "b": 8, "f": 12, "n": 10, "r": 13, "t": 9, "v": 11, "\\": 92, "'": 39, '"': 34}


def decode_go_literal(text: str, start: int) -> tuple[bytes, int] | None:
    """If a quoted literal (``"``, ``'`` or backquote) starts at ``text[start]``: its bytes and the
    index just past its closing quote. None if none starts there or it is malformed."""
    if start >= len(text) or text[start] not in "\"'`":
        return None
    q = text[start]
    out = bytearray()
    i = start + 1
    try:
        while i < len(text):
            c = text[i]
            if c == q:
                return bytes(out), i + 1
            if c == "\\" and q != "`":
                e = text[i + 1]
                if e in _SIMPLE_ESC:
                    out.append(_SIMPLE_ESC[e])
                    i += 2
                elif e == "x":
                    out.append(int(text[i + 2:i + 4], 16))
                    i += 4
                elif e in "01234567":
                    out.append(int(text[i + 1:i + 4], 8) & 0xFF)
                    i += 4
                elif e in "uU":
                    n = 4 if e == "u" else 8
                    out += chr(int(text[i + 2:i + 2 + n], 16)).encode("utf-8", "surrogatepass")
                    i += 2 + n
                else:
                    return None
                continue
            out += c.encode("utf-8", "surrogatepass")
            i += 1
    except (IndexError, ValueError):
        return None
    return None
