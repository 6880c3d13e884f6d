"""Go's strconv.Quote, in the one place every layer takes it from (storage/go_format.py)."""
from __future__ import annotations

import pytest

from promql import parser as pp
from promql.eval_labels import labels_string
from storage.go_format import go_quote, go_quote_bytes
from promql.printer import to_promql
from turboprom.api_params import invalid_param

# Outputs of Go's strconv.Quote (Go 1.19+, as Prometheus 2.42 is built with) for these inputs.
GO_QUOTE = [
    ("", '""'),
    ("up", '"up"'),
    ('a"b\\c', '"a\\"b\\\\c"'),
    ("\a\b\f\n\r\t\v", '"\\a\\b\\f\\n\\r\\t\\v"'),
    ("\x00\x01\x1f\x7f", '"\\x00\\x01\\x1f\\x7f"'),
    ("é☺日本", '"é☺日本"'),
    ("\u00a0", '"\\u00a0"'),  # no-break space: not unicode.IsPrint
    ("\u200b\u2028", '"\\u200b\\u2028"'),  # format character, line separator
    ("\ufeff", '"\\ufeff"'),
    ("\U0001F600", '"\U0001F600"'),
    ("\U000e0001", '"\\U000e0001"'),
    ("a b", '"a b"'),
]


@pytest.mark.parametrize("s,want", GO_QUOTE)
def test_go_quote_matches_strconv_quote(s: str, want: str) -> None:
    assert go_quote(s) == want


def test_go_quote_bytes_escapes_each_invalid_byte() -> None:
    assert go_quote_bytes(b"a\xffb") == '"a\\xffb"'
    assert go_quote_bytes(b"\xc5z") == '"\\xc5z"'
    assert go_quote_bytes(b"\xed\xa0\x80") == '"\\xed\\xa0\\x80"'  # an encoded surrogate is invalid UTF-8
    assert go_quote_bytes("é\u00a0".encode()) == '"é\\u00a0"'
    # A str carrying invalid bytes as surrogate escapes (as label values decoded from raw bytes do).
    assert go_quote(b"x\xff".decode("utf-8", "surrogateescape")) == '"x\\xff"'


@pytest.mark.parametrize("s,_", GO_QUOTE)
def test_every_layer_quotes_alike(s: str, _: str) -> None:
    """The printer, the evaluator's label rendering and the API's parameter errors agree."""
    q = go_quote(s)
    assert labels_string((("a", s),)) == "{a=" + q + "}"
    assert str(invalid_param(s, "x")) == f"invalid parameter {q}: x"
    printed = to_promql(pp.parse("m{a=" + q + "}"))
    assert printed == "m{a=" + q + "}"
